"""Hugging Face interop, in one place: the one mapping between a run's state dict and
``LlamaForCausalLM`` / ``MixtralForCausalLM`` (:mod:`.format`), the ``export`` command that
writes a run as a Hugging Face folder (:mod:`.export`), and the ``evaluate`` command with its
offline TinyStories lm-evaluation-harness suite (:mod:`.suite`)."""
