-- One INSERT, autocommit: the baseline of what a durable commit costs on this server.
INSERT INTO bench_rows (v) VALUES (1);
