"""Results for people: the published curves, runs compared with them, and plots."""
