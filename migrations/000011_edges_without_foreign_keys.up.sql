-- Schema version 11: step_edges without foreign keys (issue 20).
--
-- The two foreign keys of step_edges cost one lookup and one row lock each per edge (an SPI query per key at the
-- end of the statement): about a fifth of the time create_tasks spends writing a batch of chains. They re-proved
-- what the writers know already: create_tasks writes edges between steps it has just written, in the same
-- statement, and the edge trigger of the plain-SQL path (sql/030_edges.sql) looks both steps up and locks them
-- against deletion (FOR KEY SHARE, as the keys did) before it accepts an edge. Deleting steps still deletes their
-- edges: a statement trigger of sql/030_edges.sql does what ON DELETE CASCADE did, as for step_events (schema
-- version 2).
BEGIN;

ALTER TABLE stepready.step_edges
    DROP CONSTRAINT IF EXISTS step_edges_parent_step_id_fkey,
    DROP CONSTRAINT IF EXISTS step_edges_child_step_id_fkey;

COMMIT;
