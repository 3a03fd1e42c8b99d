import sys

from studylib.run.alloc import reexec_with_fast_allocator

reexec_with_fast_allocator()  # before torch is imported: see studylib/run/alloc.py

from studylib.cli import main  # noqa: E402

sys.exit(main())
