"""Policy plugins: one Protocol (base.py), one registry (registry.py), one module per policy."""
