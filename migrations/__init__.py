"""Alembic migrations for memproxy's database (a package so that installs carry them)."""
