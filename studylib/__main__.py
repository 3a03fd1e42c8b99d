import sys

from .alloc import reexec_with_fast_allocator

reexec_with_fast_allocator()  # before torch is imported: see studylib/alloc.py

from .cli import main  # noqa: E402

sys.exit(main())
