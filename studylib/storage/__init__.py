"""L0, torch-free: how files are written (atomically, with a clear line when the disk is full) and
what interrupted writes left behind."""
