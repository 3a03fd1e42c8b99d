"""L0, torch-free configuration: the typed schema, presets (load, overrides, environment), exact
parameter accounting, the budget solvers and run identity. Everything above imports it from here.
"""
from studylib.config.accounting import ParamCount, count_params, ffn_label, ffn_params, fmt_m
from studylib.config.derive import (DERIVE_RULES, TOLERANCE, Match, derive_model, iso_width_moe,
                                    match_dense, soft_fixed_width)
from studylib.config.identity import config_hash, identity_diff, run_document, run_identity, same_run
from studylib.config.presets import (Preset, apply_overrides, load_preset, override, override_pairs,
                                     preset_from_dict, value_at, variant_tag,
                                     with_absolute_paths)
from studylib.config.study import StudyConfig
from studylib.config.schema import (ConfigError, DataConfig, FFNConfig, ModelConfig, TrainConfig,
                                    dataclass_from_dict, deep_merge, model_from_dict, to_dict)

__all__ = [
    "override_pairs", "value_at", "variant_tag", "with_absolute_paths", "StudyConfig",
    "run_identity", "identity_diff",
    "ConfigError", "DataConfig", "FFNConfig", "ModelConfig", "TrainConfig", "Preset", "ParamCount",
    "Match", "DERIVE_RULES", "TOLERANCE", "apply_overrides", "config_hash", "count_params",
    "dataclass_from_dict", "deep_merge", "derive_model", "ffn_label", "ffn_params", "fmt_m",
    "iso_width_moe", "load_preset", "match_dense", "model_from_dict", "override", "preset_from_dict",
    "run_document", "same_run", "soft_fixed_width", "to_dict",
]
