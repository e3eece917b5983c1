"""Storage: SQLite (native threads, WAL) and PostgreSQL (psycopg 3), numbered migrations in
`schema/`, and one store per domain. Stores know rows and plain types, never a service."""
