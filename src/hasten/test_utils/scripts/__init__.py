"""Scripts that Accelerate's tests launch by path (``path_in_accelerate_package("test_utils", "scripts", ...)``)."""
