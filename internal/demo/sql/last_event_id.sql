-- Where the account starts: only events recorded after this id are shown.
SELECT COALESCE(max(id), 0) FROM stepready.step_events
