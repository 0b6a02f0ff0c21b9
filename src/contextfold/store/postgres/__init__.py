"""The PostgreSQL backend (``contextfold[postgres]``: psycopg 3 with a connection pool): the
stores many processes and hosts share. Selected by a ``postgresql://`` URL."""
