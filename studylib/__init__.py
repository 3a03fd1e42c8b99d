"""studylib: dense vs mixture-of-experts pretraining at tiny scale (TinyStories)."""
__version__ = "0.1.0"
