"""burn_remote: pick a device at run time, and the same tensor code runs there."""
