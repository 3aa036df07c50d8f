"""The commands, one module each: python -m tdmpc.<name> runs tdmpc.cli.<name> (through the thin module of that
name at the package's top, which -m needs); the console scripts (tdmpc-train, ...) call the same main()."""
