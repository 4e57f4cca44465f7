-- Data flow between steps (SPEC §18; docs/dataflow.md). One parser of references in a step's input, used by the
-- checks at creation (create_task(s), templates, the plain-SQL path's commit-time trigger) and by the resolution
-- when an attempt starts (start_steps, claim_and_start_steps); Go does not parse references. The output cap
-- (settings.max_output_bytes) is read here by every function that records an output.
--
-- A reference is `${` followed by one of the roots deps, context, task, element, index, then either `}` or a
-- dot-separated path and `}`: `${deps.fetch.items.0.id}`, `${context.user}`, `${task.id}`. Any other `${…}` is
-- plain text (a shell's `${HOME}` in an exec step's input stays as written), and `$${` before a root writes a
-- literal `${` (`$${context.x}` is the text `${context.x}`). A path segment is an object key, or an array index
-- when the value there is an array (negative indexes count from the end, as jsonb's #> does).

-- The pieces of one string, in order: a literal (lit), a reference (ref: its text as written, path: the root
-- and its segments), or, instead of the rest, what is wrong with it (problem; the pieces before it stay). Never
-- raises: a start must not abort a batch for one bad input.
CREATE OR REPLACE FUNCTION stepready._ref_parse(p_text text)
RETURNS TABLE (lit text, ref text, path text[], problem text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $fn$
DECLARE
    v_pos   int := 1;          -- first character not yet emitted
    v_from  int := 1;          -- where to look for the next `${`
    v_at    int;
    v_close int;
    v_body  text;
    v_root  text;
    v_len   int := length(p_text);
BEGIN
    IF p_text IS NULL THEN
        RETURN;
    END IF;
    LOOP
        v_at := strpos(substr(p_text, v_from), '${');
        EXIT WHEN v_at = 0;
        v_at := v_from + v_at - 1;
        v_root := substring(substr(p_text, v_at + 2, 9) FROM '^(deps|context|task|element|index)(?:[.}]|$)');
        IF v_root IS NULL THEN
            v_from := v_at + 2;      -- not a reference: plain text
            CONTINUE;
        END IF;
        IF v_at > v_pos AND substr(p_text, v_at - 1, 1) = '$' THEN
            -- `$${root…`: the escape writes `${` and the rest is plain text.
            lit := substr(p_text, v_pos, v_at - 1 - v_pos) || '${'; ref := NULL; path := NULL; problem := NULL;
            RETURN NEXT;
            v_pos := v_at + 2;
            v_from := v_pos;
            CONTINUE;
        END IF;
        IF v_at > v_pos THEN
            lit := substr(p_text, v_pos, v_at - v_pos); ref := NULL; path := NULL; problem := NULL;
            RETURN NEXT;
        END IF;
        v_close := strpos(substr(p_text, v_at + 2), '}');
        IF v_close = 0 THEN
            lit := NULL; ref := NULL; path := NULL;
            problem := format('reference %s is not closed by }', substr(p_text, v_at, 40));
            RETURN NEXT;
            RETURN;
        END IF;
        v_body := substr(p_text, v_at + 2, v_close - 1);
        ref := '${' || v_body || '}';
        lit := NULL;
        path := string_to_array(v_body, '.');
        problem := CASE
            WHEN strpos(v_body, '{') > 0 OR strpos(v_body, '$') > 0
                THEN format('reference %s: a path may not hold $ or {', ref)
            WHEN '' = ANY (path) THEN format('reference %s: empty path segment', ref)
            WHEN path[1] = 'deps' AND cardinality(path) < 2
                THEN format('reference %s: name the parent step (${deps.NAME.PATH})', ref)
            WHEN path[1] = 'task' AND path IS DISTINCT FROM ARRAY['task', 'id']
                THEN format('reference %s: a task reference is ${task.id}', ref)
            WHEN path[1] = 'index' AND cardinality(path) > 1
                THEN format('reference %s: ${index} has no path', ref)
        END;
        IF problem IS NOT NULL THEN
            ref := NULL; path := NULL;
            RETURN NEXT;
            RETURN;
        END IF;
        RETURN NEXT;
        v_pos := v_at + 2 + v_close;
        v_from := v_pos;
    END LOOP;
    IF v_pos <= v_len THEN
        lit := substr(p_text, v_pos); ref := NULL; path := NULL; problem := NULL;
        RETURN NEXT;
    END IF;
END;
$fn$;

-- The references of one input (every string value, at any depth, that holds `${`), in document order, and the
-- first syntax problem if any (as a reference row with problem set).
CREATE OR REPLACE FUNCTION stepready._input_refs(p_input jsonb)
RETURNS TABLE (ref text, path text[], problem text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$
    SELECT p.ref, p.path, p.problem
      FROM jsonb_path_query(p_input, 'strict $.**') WITH ORDINALITY AS v(val, o)
     CROSS JOIN LATERAL stepready._ref_parse(v.val #>> '{}') WITH ORDINALITY AS p(lit, ref, path, problem, n)
     WHERE jsonb_typeof(v.val) = 'string' AND strpos(v.val #>> '{}', '${') > 0
       AND p.lit IS NULL
     ORDER BY v.o, p.n;
$fn$;

-- What is wrong with the references of a step's input, as the end of a message (`input: …`), or NULL.
-- p_parents: the names of the step's direct parents (its depends_on); p_map: whether the step is a map step
-- (SPEC §19: only its elements have ${element…} and ${index}).
CREATE OR REPLACE FUNCTION stepready._input_refs_problem(p_input jsonb, p_parents text[], p_map bool DEFAULT false)
RETURNS text
LANGUAGE sql STABLE
AS $fn$
    SELECT 'input: ' || CASE
               WHEN r.problem IS NOT NULL THEN r.problem
               WHEN r.path[1] = 'deps'
                   THEN format('reference %s names step "%s", which is not a direct parent (depends_on)',
                               r.ref, r.path[2])
               ELSE format('reference %s: only the elements of a map step have ${element} and ${index}', r.ref)
           END
      FROM stepready._input_refs(p_input) WITH ORDINALITY AS r(ref, path, problem, o)
     WHERE r.problem IS NOT NULL
        OR (r.path[1] = 'deps' AND NOT r.path[2] = ANY (COALESCE(p_parents, '{}')))
        OR (r.path[1] IN ('element', 'index') AND NOT p_map)
     ORDER BY r.o
     LIMIT 1;
$fn$;

-- One string with references resolved against p_scope (an object with the members deps, context, task and, for
-- an element, element and index). A string that is exactly one reference becomes the value it names, with its
-- type; references inside a longer string are replaced by the text of their value (a string's text, a number,
-- true/false, null); an object or an array there is a problem. A path that names nothing is a problem naming
-- the reference. Never raises.
CREATE OR REPLACE FUNCTION stepready._resolve_string(p_text text, p_scope jsonb, OUT value jsonb, OUT problem text)
LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
    r      record;
    v_n    int := 0;
    v_out  text := '';
    v_val  jsonb;
    v_one  jsonb;
    v_refs int := 0;
BEGIN
    FOR r IN SELECT * FROM stepready._ref_parse(p_text) LOOP
        v_n := v_n + 1;
        IF r.problem IS NOT NULL THEN
            problem := r.problem;
            RETURN;
        ELSIF r.lit IS NOT NULL THEN
            v_out := v_out || r.lit;
        ELSE
            v_refs := v_refs + 1;
            v_val := p_scope #> r.path;
            IF v_val IS NULL THEN
                problem := format('input reference %s: %s not found', r.ref, array_to_string(r.path, '.'));
                RETURN;
            END IF;
            v_one := v_val;
            IF jsonb_typeof(v_val) IN ('object', 'array') THEN
                -- Allowed only when the string is this one reference (checked below).
                v_out := NULL;
            ELSIF v_out IS NOT NULL THEN
                v_out := v_out || COALESCE(v_val #>> '{}', 'null');
            END IF;
        END IF;
    END LOOP;
    IF v_n = 1 AND v_refs = 1 THEN
        value := v_one;
    ELSIF v_out IS NULL THEN
        problem := format('input %s: a reference inside a longer string must name a scalar, not an object or array',
                          to_jsonb(p_text));
    ELSE
        value := to_jsonb(v_out);
    END IF;
END;
$fn$;

-- A step's input with its references resolved (SPEC §18), or the first problem (value NULL). p_deps: the
-- step's deps object; p_element and p_element_index: a map element's (NULL otherwise). Only the strings that
-- hold `${` are looked at; the rest of the document is kept as it is. Never raises.
CREATE OR REPLACE FUNCTION stepready._resolve_input(p_input jsonb, p_deps jsonb, p_context jsonb, p_task_id bigint,
                                                    p_element jsonb DEFAULT NULL, p_element_index int DEFAULT NULL,
                                                    OUT value jsonb, OUT problem text)
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    SELECT v.value, v.problem INTO value, problem
      FROM stepready._resolve_value(p_input,
               jsonb_build_object('deps', COALESCE(p_deps, '{}'), 'context', COALESCE(p_context, '{}'),
                                  'task', jsonb_build_object('id', p_task_id))
               || CASE WHEN p_element_index IS NOT NULL
                       THEN jsonb_build_object('element', p_element, 'index', p_element_index)
                       ELSE '{}' END) v;
END;
$fn$;

-- The path of a string that is exactly one well-formed reference (`${deps.fetch.items}`, `${task.id}`,
-- `${index}`: the common case), else NULL (no reference, text around it, several, a malformed one, the `$${`
-- escape: _resolve_string parses those and names what is wrong). Lets _resolve_value look the common case up
-- without the parser's calls: the same rules as _ref_parse (a root, non-empty segments holding no `.`, `$`, `{`
-- or `}`, a parent named after deps, task only as task.id, index without a path).
CREATE OR REPLACE FUNCTION stepready._ref_whole(p_text text)
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$
    SELECT CASE WHEN p_text ~ '^\$\{(?:(?:deps\.[^.${}]+|context|element)(?:\.[^.${}]+)*|task\.id|index)\}$'
                THEN string_to_array(substr(p_text, 3, length(p_text) - 3), '.') END;
$fn$;

-- _resolve_input's walk over one JSON value. A string that is exactly one reference is looked up at once (in an
-- object or an array, without a call per member); any other string holding `${` goes through _resolve_string.
CREATE OR REPLACE FUNCTION stepready._resolve_value(p_value jsonb, p_scope jsonb, OUT value jsonb, OUT problem text)
LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
    r      record;
    v_sub  record;
    v_path text[];
    v_one  jsonb;
BEGIN
    IF p_value IS NULL OR strpos(p_value::text, '${') = 0 THEN
        value := p_value;
        RETURN;
    END IF;
    CASE jsonb_typeof(p_value)
        WHEN 'string' THEN
            v_path := stepready._ref_whole(p_value #>> '{}');
            IF v_path IS NOT NULL THEN
                value := p_scope #> v_path;
                IF value IS NULL THEN
                    problem := format('input reference %s: %s not found', p_value #>> '{}',
                                      array_to_string(v_path, '.'));
                END IF;
                RETURN;
            END IF;
            SELECT s.value, s.problem INTO value, problem FROM stepready._resolve_string(p_value #>> '{}', p_scope) s;
        WHEN 'array' THEN
            value := '[]';
            FOR r IN SELECT e.v FROM jsonb_array_elements(p_value) WITH ORDINALITY AS e(v, o) ORDER BY e.o LOOP
                v_path := CASE WHEN jsonb_typeof(r.v) = 'string' THEN stepready._ref_whole(r.v #>> '{}') END;
                IF strpos(r.v::text, '${') = 0 THEN
                    v_one := r.v;
                ELSIF v_path IS NOT NULL AND p_scope #> v_path IS NOT NULL THEN
                    v_one := p_scope #> v_path;
                ELSE
                    SELECT x.value, x.problem INTO v_sub FROM stepready._resolve_value(r.v, p_scope) x;
                    IF v_sub.problem IS NOT NULL THEN
                        value := NULL;
                        problem := v_sub.problem;
                        RETURN;
                    END IF;
                    v_one := v_sub.value;
                END IF;
                value := value || jsonb_build_array(v_one);
            END LOOP;
        WHEN 'object' THEN
            value := '{}';
            FOR r IN SELECT e.key, e.value AS v FROM jsonb_each(p_value) AS e LOOP
                v_path := CASE WHEN jsonb_typeof(r.v) = 'string' THEN stepready._ref_whole(r.v #>> '{}') END;
                IF strpos(r.v::text, '${') = 0 THEN
                    v_one := r.v;
                ELSIF v_path IS NOT NULL AND p_scope #> v_path IS NOT NULL THEN
                    v_one := p_scope #> v_path;
                ELSE
                    SELECT x.value, x.problem INTO v_sub FROM stepready._resolve_value(r.v, p_scope) x;
                    IF v_sub.problem IS NOT NULL THEN
                        value := NULL;
                        problem := v_sub.problem;
                        RETURN;
                    END IF;
                    v_one := v_sub.value;
                END IF;
                value := value || jsonb_build_object(r.key, v_one);
            END LOOP;
        ELSE
            value := p_value;
    END CASE;
END;
$fn$;

-- The deps object of a step (SPEC §18): one member per direct parent that is complete or resolved_manually, named
-- by the parent's name, whose value is its output; a skipped parent has none. '{}' for a step without such
-- parents. One probe of step_edges_child_idx and one primary-key lookup per parent.
-- PL/pgSQL, not SQL: called from PL/pgSQL statements a SQL function with a FROM clause is not inlined, and was
-- parsed and planned at every call (2.1 ms a call under load, pg_stat_user_functions); PL/pgSQL keeps the plan.
CREATE OR REPLACE FUNCTION stepready._step_deps(p_step_id bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    RETURN (SELECT COALESCE(jsonb_object_agg(p.name, p.output), '{}')
              FROM stepready.step_edges e
              JOIN stepready.steps p ON p.id = e.parent_step_id
             WHERE e.child_step_id = p_step_id AND p.state IN ('complete', 'resolved_manually'));
END;
$fn$;

-- Attempts just started whose input does not resolve fail at once (class deterministic, the message naming the
-- reference; on_exhausted applies) instead of reaching a worker: called by the start functions, after they have
-- returned the attempts that did resolve, with the ids they started. Returns the ids it failed.
CREATE OR REPLACE FUNCTION stepready._fail_unresolved(p_ids bigint[], p_as_of timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_ids    bigint[];
    v_tokens int[];
    v_errors jsonb[];
BEGIN
    SELECT array_agg(x.id ORDER BY x.id), array_agg(x.fence_token ORDER BY x.id),
           array_agg(jsonb_build_object('class', 'deterministic', 'code', 'input_reference', 'message', x.problem)
                     ORDER BY x.id)
      INTO v_ids, v_tokens, v_errors
      FROM (SELECT s.id, s.fence_token,
                   (stepready._resolve_input(s.input, stepready._step_deps(COALESCE(s.map_step_id, s.id)),
                                             (SELECT t.context FROM stepready.tasks t WHERE t.id = s.task_id),
                                             s.task_id, s.element, s.element_index)).problem AS problem
              FROM stepready.steps s
             WHERE s.id = ANY (p_ids) AND s.state = 'in_progress' AND s.input_refs) x
     WHERE x.problem IS NOT NULL;
    IF v_ids IS NOT NULL THEN
        PERFORM stepready.fail_steps(v_ids, v_tokens, v_errors, p_as_of, array_fill(0::float8, ARRAY[cardinality(v_ids)]));
    END IF;
    RETURN v_ids;
END;
$fn$;

-- The output cap (SPEC §18): the largest output, in bytes of its JSON text, that complete_step(s), continue_step
-- and resolve_step accept. Kept in stepready.settings (row max_output_bytes, default 1 MiB); an operator
-- changes it with UPDATE.
-- PL/pgSQL for its cached plan, as _step_deps.
CREATE OR REPLACE FUNCTION stepready._max_output_bytes()
RETURNS bigint
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    RETURN COALESCE((SELECT (s.value #>> '{}')::bigint FROM stepready.settings s WHERE s.name = 'max_output_bytes'),
                    1048576);
END;
$fn$;

-- Raises 54000 (program_limit_exceeded) naming the step, the size and the limit when an output is over the cap.
CREATE OR REPLACE FUNCTION stepready._check_output_size(p_step_id bigint, p_output jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    v_size bigint;
    v_max  bigint;
BEGIN
    IF p_output IS NULL THEN
        RETURN;
    END IF;
    v_size := octet_length(p_output::text);
    v_max := stepready._max_output_bytes();
    IF v_size > v_max THEN
        RAISE EXCEPTION 'step %: output is % bytes, over the limit of % bytes (stepready.settings max_output_bytes)',
            p_step_id, v_size, v_max USING ERRCODE = '54000';
    END IF;
END;
$fn$;

-- The plain-SQL path (SPEC §2): a step inserted with references in its input is checked when the transaction
-- commits (its edges come after it): every ${deps.NAME} must name a direct parent, and the syntax must hold.
-- Not queued at all for a row without `${` (WHEN clause), nor for the rows of create_tasks, which checked them
-- before writing (sql/018_validated_write.sql).
CREATE OR REPLACE FUNCTION stepready._steps_check_refs()
RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_problem text;
    v_name    text;
    v_input   jsonb;
    v_map     bool;
BEGIN
    SELECT s.name, s.input, s.map IS NOT NULL INTO v_name, v_input, v_map FROM stepready.steps s WHERE s.id = NEW.id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_problem := stepready._input_refs_problem(v_input,
        (SELECT array_agg(p.name) FROM stepready.step_edges e JOIN stepready.steps p ON p.id = e.parent_step_id
          WHERE e.child_step_id = NEW.id), v_map);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'step % "%": %', NEW.id, v_name, v_problem USING ERRCODE = '22023';
    END IF;
    RETURN NULL;
END;
$fn$;

-- A constraint trigger has no CREATE OR REPLACE: dropped and created again on every migrate up.
DROP TRIGGER IF EXISTS steps_check_refs ON stepready.steps;
DO $trigger$ BEGIN EXECUTE replace($sql$
CREATE CONSTRAINT TRIGGER steps_check_refs
    AFTER INSERT ON stepready.steps
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.input_refs AND NOT stepready._validated_write())
    EXECUTE FUNCTION stepready._steps_check_refs()
$sql$, 'stepready._validated_write()', stepready._validated_write_sql()); END $trigger$;
