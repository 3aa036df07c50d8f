"""Which tasks a run trains on: the reference task sets (mt30, mt80) and a multi-task run's setup."""
