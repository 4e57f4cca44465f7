-- create_task of a one-step task, autocommit: whatever the schema's functions do in the transaction (before
-- schema version 21: a NOTIFY; from it: an increment of stepready.wakeups).
SELECT stepready.create_task('{"name": "t", "steps": [{"name": "a", "handler": "h"}]}');
