"""One typed config for everything: defaults < JSON file (--cfg) < CLI flags.

Field names follow the reference TD-MPC2 implementation where one exists, so people
coming from it find them. Every field has a one-line docstring, which `--help` shows.
Validation runs before anything heavy and fails with one line that names the field.

By job: fields.py declares Config's fields by section, planner.py the planner's settings (MPPIConfig, a section
Config inherits), checks.py validates a config, and parsing.py reads one from JSON and from the command line.
This layer imports only errors.py, runtime/ and tasks/ (the reference task sets): docs/layout.md.
"""

from tdmpc.config.checks import validate
from tdmpc.config.fields import AS_BEFORE_ADDED, FIELD_NAMES, MAX_DEFAULT_UPDATES, MODEL_SIZES, SIZE_FIELDS, Config, \
    NetworkSettings
from tdmpc.config.parsing import CONFIG_DIR, CPU_CONFIG, NOT_COMPARED, available_configs, changed_fields, \
    find_config_file, from_dict, learning_differences, load_json, parse_cli, read_json, save_json, unknown_key_error
from tdmpc.config.planner import MPPIConfig
from tdmpc.errors import ConfigError

__all__ = ["AS_BEFORE_ADDED", "CONFIG_DIR", "CPU_CONFIG", "FIELD_NAMES", "MAX_DEFAULT_UPDATES", "MODEL_SIZES",
           "NOT_COMPARED", "SIZE_FIELDS", "Config", "ConfigError", "MPPIConfig", "NetworkSettings", "available_configs",
           "changed_fields", "find_config_file", "from_dict", "learning_differences", "load_json", "parse_cli",
           "read_json", "save_json", "unknown_key_error", "validate"]
