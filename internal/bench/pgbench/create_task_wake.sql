-- create_task then stepready.wake_daemons() (what the Go library does after committing, here uncoalesced).
SELECT stepready.create_task('{"name": "t", "steps": [{"name": "a", "handler": "h"}]}');
SELECT stepready.wake_daemons();
