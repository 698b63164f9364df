"""Tests for the memory package."""
