"""hasten's ground: modules that import nothing of hasten above them."""
