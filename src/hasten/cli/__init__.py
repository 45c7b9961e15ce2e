"""The `hasten` command line. Help is printed without importing torch."""
