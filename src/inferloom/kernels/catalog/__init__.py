"""Placeholder; filled below."""
