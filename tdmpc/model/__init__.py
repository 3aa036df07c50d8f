"""The world model: its layers, the fused CPU kernel, its settings, our checkpoint format and the reference TD-MPC2's."""
