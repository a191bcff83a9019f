"""Agents: Protocols (base.py) and deterministic default implementations (rules.py)."""
