"""Long-term memory: the store (SQLite or PostgreSQL through SQLAlchemy), and what builds on it."""
