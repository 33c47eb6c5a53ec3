"""icelog's tests, one folder per package of src/icelog (tests/system: the whole product); helpers in tests/support."""
