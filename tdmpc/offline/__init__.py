"""Offline data: the dataset file format, its writer, samplers, conversion from replay buffers, Minari."""
