"""The reference task sets, mt30 and mt80 (sets.py): pure data, below the config layer. A multi-task run's
setup, which reads a Config, is tdmpc/multitask.py."""
