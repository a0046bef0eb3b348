"""Dagster definitions, kept thin: each asset calls one plain function and reports what it did."""
