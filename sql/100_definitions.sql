-- Task definitions (SPEC §10): one JSON document → one task, validated completely before anything is written.

-- Checks the shape of a rules list (SPEC §8). CEL expressions themselves are compiled by the Go entry points;
-- SQL checks only what it can: an array of {when, then} objects with an optional final {else}.
CREATE OR REPLACE FUNCTION stepready._validate_rules(p_rules jsonb, p_where text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    r     jsonb;
    i     int := 0;
    n     int;
    v_w   text;
    v_act jsonb;
BEGIN
    IF p_rules IS NULL OR jsonb_typeof(p_rules) = 'null' THEN
        RETURN;
    END IF;
    IF jsonb_typeof(p_rules) <> 'array' THEN
        PERFORM stepready._definition_error(p_where, format('must be an array of rules, got %s', jsonb_typeof(p_rules)));
    END IF;
    n := jsonb_array_length(p_rules);
    FOR r IN SELECT value FROM jsonb_array_elements(p_rules) LOOP
        v_w := format('%s[%s]', p_where, i);
        IF jsonb_typeof(r) <> 'object' THEN
            PERFORM stepready._definition_error(v_w, 'must be an object {when, then} or {else}');
        END IF;
        IF r ? 'else' THEN
            PERFORM stepready._reject_unknown_keys(r, ARRAY['else'], v_w);
            IF i <> n - 1 THEN
                PERFORM stepready._definition_error(v_w, 'else must be the last rule');
            END IF;
            v_act := r -> 'else';
            v_w := v_w || '.else';
        ELSE
            PERFORM stepready._reject_unknown_keys(r, ARRAY['when', 'then'], v_w);
            IF stepready._json_text(r -> 'when', v_w || '.when') IS NULL OR NOT r ? 'then' THEN
                PERFORM stepready._definition_error(v_w, 'a rule needs both when and then');
            END IF;
            v_act := r -> 'then';
            v_w := v_w || '.then';
        END IF;
        IF jsonb_typeof(v_act) <> 'object' THEN
            PERFORM stepready._definition_error(v_w, 'must be an object with a "do" field');
        END IF;
        IF NOT COALESCE(v_act ->> 'do', '') IN ('retry', 'fail', 'continue', 'repeat', 'break') THEN
            PERFORM stepready._definition_error(v_w || '.do',
                format('must be one of retry, fail, continue, repeat, break, got %s', COALESCE(v_act -> 'do', 'null')));
        END IF;
        i := i + 1;
    END LOOP;
END;
$$;

-- Validates a task definition and returns its step names in a topological order (parents first).
-- Every message names the field and, for steps, the index and name: `steps[2] "load": depends_on: …`.
CREATE OR REPLACE FUNCTION stepready._check_definition(p_definition jsonb)
RETURNS text[]
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    d        jsonb := p_definition;
    v_st     jsonb;
    v_dep    jsonb;
    v_i      int;
    v_n      int;
    v_w      text;
    v_name   text;
    v_qname  text;
    v_index  jsonb := '{}';  -- step name → 0-based position
    -- Kahn's algorithm over positions (1-based in the arrays).
    v_indeg  int[];
    v_kids   int[];          -- children of every step, grouped by parent (CSR layout)
    v_start  int[];          -- v_kids offsets: children of k are v_kids[v_start[k] .. v_start[k+1]-1]
    v_queue  int[];
    v_head   int := 1;
    v_order  text[] := '{}';
    v_names  text[] := '{}';
    v_k      int;
    v_j      int;
    v_cycle  text[];
    v_cur    int;
BEGIN
    IF d IS NULL OR jsonb_typeof(d) <> 'object' THEN
        PERFORM stepready._definition_error('definition', 'must be a JSON object');
    END IF;
    PERFORM stepready._reject_unknown_keys(d,
        ARRAY['name', 'namespace', 'context', 'priority', 'idempotency_key', 'retry', 'steps', 'run_at',
              'concurrency', 'rate_limit'], 'definition');
    IF stepready._json_text(d -> 'name', 'name') IS NULL THEN
        PERFORM stepready._definition_error('name', 'is required');
    END IF;
    PERFORM stepready._json_text(d -> 'namespace', 'namespace');
    IF jsonb_typeof(d -> 'context') NOT IN ('object', 'null') THEN
        PERFORM stepready._definition_error('context', format('must be an object, got %s', jsonb_typeof(d -> 'context')));
    END IF;
    PERFORM stepready._json_integer(d -> 'priority', 'priority', -2147483648, 2147483647);
    PERFORM stepready._json_text(d -> 'idempotency_key', 'idempotency_key');
    PERFORM stepready._json_run_at(d -> 'run_at', 'run_at'); -- SPEC §15, sql/120_run_at.sql
    PERFORM stepready._validate_retry(d -> 'retry', 'retry');
    -- SPEC §14: the task's flow control is the default of its steps; placeholders are checked per step.
    PERFORM stepready._flow_validate(d -> 'concurrency', 'concurrency', 'concurrency', NULL, NULL);
    PERFORM stepready._flow_validate(d -> 'rate_limit', 'rate_limit', 'rate_limit', NULL, NULL);
    IF jsonb_typeof(d -> 'steps') IS DISTINCT FROM 'array' OR jsonb_array_length(d -> 'steps') = 0 THEN
        PERFORM stepready._definition_error('steps', 'must be a non-empty array of steps');
    END IF;
    v_n := jsonb_array_length(d -> 'steps');

    -- Pass 1: each step on its own; names must be unique.
    v_i := 0;
    FOR v_st IN SELECT value FROM jsonb_array_elements(d -> 'steps') LOOP
        v_w := format('steps[%s]', v_i);
        IF jsonb_typeof(v_st) <> 'object' THEN
            PERFORM stepready._definition_error(v_w, 'must be an object');
        END IF;
        v_name := stepready._json_text(v_st -> 'name', v_w || ': name');
        IF v_name IS NULL THEN
            PERFORM stepready._definition_error(v_w || ': name', 'is required');
        END IF;
        v_w := format('steps[%s] "%s"', v_i, v_name);
        v_names := v_names || v_name;
        PERFORM stepready._reject_unknown_keys(v_st,
            ARRAY['name', 'handler', 'input', 'depends_on', 'retry', 'timeout_ms', 'on_exhausted', 'rules',
                  'max_iterations', 'collect', 'queue', 'priority', 'breaker_limit', 'concurrency', 'rate_limit'],
            v_w);
        IF stepready._json_text(v_st -> 'handler', v_w || ': handler') IS NULL THEN
            PERFORM stepready._definition_error(v_w || ': handler', 'is required');
        END IF;
        -- Bounds of what reaches River and the Go runtime (sql/015_bounds.sql), each behind an inline test: a step
        -- within them costs no function call.
        IF char_length(v_st ->> 'handler') > 255 THEN
            PERFORM stepready._bound_check(stepready._name_problem(v_st ->> 'handler'), v_w, 'handler');
        END IF;
        PERFORM stepready._validate_retry(v_st -> 'retry', v_w || ': retry');
        IF stepready._json_integer(v_st -> 'timeout_ms', v_w || ': timeout_ms', 1) > 9223372036854 THEN
            PERFORM stepready._json_duration_ms(v_st -> 'timeout_ms', v_w || ': timeout_ms', 1);
        END IF;
        IF COALESCE(stepready._json_text(v_st -> 'on_exhausted', v_w || ': on_exhausted'), 'fail_task')
           NOT IN ('fail_task', 'skip', 'skip_cascade') THEN
            PERFORM stepready._definition_error(v_w || ': on_exhausted',
                format('must be fail_task, skip or skip_cascade, got %s', v_st -> 'on_exhausted'));
        END IF;
        PERFORM stepready._validate_rules(v_st -> 'rules', v_w || ': rules');
        PERFORM stepready._json_integer(v_st -> 'max_iterations', v_w || ': max_iterations', 1, 2147483647);
        IF COALESCE(stepready._json_text(v_st -> 'collect', v_w || ': collect'), 'replace')
           NOT IN ('append', 'replace', 'merge') THEN
            PERFORM stepready._definition_error(v_w || ': collect',
                format('must be append, replace or merge, got %s', v_st -> 'collect'));
        END IF;
        v_qname := stepready._json_text(v_st -> 'queue', v_w || ': queue');
        IF v_qname <> 'default' THEN
            PERFORM stepready._bound_check(stepready._queue_problem(v_qname), v_w, 'queue');
        END IF;
        PERFORM stepready._json_integer(v_st -> 'priority', v_w || ': priority', -2147483648, 2147483647);
        PERFORM stepready._json_integer(v_st -> 'breaker_limit', v_w || ': breaker_limit', 0, 2147483647);
        PERFORM stepready._flow_validate(COALESCE(NULLIF(v_st -> 'concurrency', 'null'), d -> 'concurrency'),
                                         'concurrency',
                                         v_w || ': concurrency' || CASE WHEN NULLIF(v_st -> 'concurrency', 'null') IS NULL
                                                                        THEN ' (the task''s)' ELSE '' END,
                                         COALESCE(NULLIF(d -> 'context', 'null'), '{}'),
                                         COALESCE(NULLIF(v_st -> 'input', 'null'), '{}'));
        PERFORM stepready._flow_validate(COALESCE(NULLIF(v_st -> 'rate_limit', 'null'), d -> 'rate_limit'),
                                         'rate_limit',
                                         v_w || ': rate_limit' || CASE WHEN NULLIF(v_st -> 'rate_limit', 'null') IS NULL
                                                                       THEN ' (the task''s)' ELSE '' END,
                                         COALESCE(NULLIF(d -> 'context', 'null'), '{}'),
                                         COALESCE(NULLIF(v_st -> 'input', 'null'), '{}'));
        IF jsonb_typeof(v_st -> 'depends_on') NOT IN ('array', 'null') THEN
            PERFORM stepready._definition_error(v_w || ': depends_on', 'must be an array of step names');
        END IF;
        v_i := v_i + 1;
    END LOOP;

    -- Names are unique. (Built once here: growing a jsonb object step by step would cost O(steps²).)
    SELECT format('steps[%s] "%s": name', o - 1, x), format('duplicate step name (also steps[%s])', first - 1)
      INTO v_w, v_name
      FROM (SELECT x, o, min(o) OVER (PARTITION BY x) AS first
              FROM unnest(v_names) WITH ORDINALITY AS u(x, o)) d
     WHERE o > first
     ORDER BY o
     LIMIT 1;
    IF FOUND THEN
        PERFORM stepready._definition_error(v_w, v_name);
    END IF;
    SELECT jsonb_object_agg(x, o - 1) INTO v_index FROM unnest(v_names) WITH ORDINALITY AS u(x, o);

    -- Pass 2: dependencies name known steps, once each, never the step itself.
    v_i := 0;
    FOR v_st IN SELECT value FROM jsonb_array_elements(d -> 'steps') LOOP
        v_w := format('steps[%s] "%s": depends_on', v_i, v_st ->> 'name');
        FOR v_dep IN SELECT value FROM jsonb_array_elements(COALESCE(NULLIF(v_st -> 'depends_on', 'null'), '[]')) LOOP
            IF jsonb_typeof(v_dep) <> 'string' THEN
                PERFORM stepready._definition_error(v_w, format('must contain step names, got %s', v_dep));
            ELSIF NOT v_index ? (v_dep #>> '{}') THEN
                PERFORM stepready._definition_error(v_w, format('unknown step "%s"', v_dep #>> '{}'));
            ELSIF v_dep #>> '{}' = v_st ->> 'name' THEN
                PERFORM stepready._definition_error(v_w, 'a step cannot depend on itself');
            END IF;
        END LOOP;
        IF (SELECT count(*) <> count(DISTINCT value)
              FROM jsonb_array_elements_text(COALESCE(NULLIF(v_st -> 'depends_on', 'null'), '[]'))) THEN
            PERFORM stepready._definition_error(v_w, 'lists a step twice');
        END IF;
        v_i := v_i + 1;
    END LOOP;

    -- Pass 3: no cycle. Kahn's algorithm, O(steps + edges).
    -- In-degree of every step, its children grouped by parent, and where each parent's group starts.
    SELECT array_agg(jsonb_array_length(COALESCE(NULLIF(e.x -> 'depends_on', 'null'), '[]')) ORDER BY ord)
      INTO v_indeg
      FROM jsonb_array_elements(d -> 'steps') WITH ORDINALITY AS e(x, ord);
    WITH edges AS (
        SELECT (v_index ->> e2.dep)::int + 1 AS parent, (v_index ->> (e.x ->> 'name'))::int + 1 AS child
          FROM jsonb_array_elements(d -> 'steps') AS e(x),
               jsonb_array_elements_text(COALESCE(NULLIF(e.x -> 'depends_on', 'null'), '[]')) AS e2(dep)
    ), groups AS (
        SELECT g.k, 1 + COALESCE(sum(c.cnt) OVER (ORDER BY g.k ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                                 0)::int AS first
          FROM generate_series(1, v_n + 1) AS g(k)
          LEFT JOIN (SELECT parent, count(*) AS cnt FROM edges GROUP BY parent) c ON c.parent = g.k
    )
    SELECT (SELECT COALESCE(array_agg(child ORDER BY parent, child), '{}') FROM edges),
           (SELECT array_agg(first ORDER BY groups.k) FROM groups)
      INTO v_kids, v_start;

    v_queue := ARRAY(SELECT k2 FROM generate_subscripts(v_indeg, 1) AS k2 WHERE v_indeg[k2] = 0 ORDER BY k2);
    WHILE v_head <= cardinality(v_queue) LOOP
        v_k := v_queue[v_head];
        v_head := v_head + 1;
        v_order := v_order || v_names[v_k];
        FOR v_j IN v_start[v_k] .. v_start[v_k + 1] - 1 LOOP
            v_indeg[v_kids[v_j]] := v_indeg[v_kids[v_j]] - 1;
            IF v_indeg[v_kids[v_j]] = 0 THEN
                v_queue := v_queue || v_kids[v_j];
            END IF;
        END LOOP;
    END LOOP;

    IF cardinality(v_order) < v_n THEN
        -- Every step left has a parent that is also left: walk parents until a step repeats.
        SELECT min(k2) INTO v_cur FROM generate_subscripts(v_indeg, 1) AS k2 WHERE v_indeg[k2] > 0;
        v_cycle := ARRAY[v_names[v_cur]];
        LOOP
            SELECT (v_index ->> p.dep)::int + 1 INTO v_cur
              FROM jsonb_array_elements_text(d -> 'steps' -> (v_cur - 1) -> 'depends_on') AS p(dep)
             WHERE v_indeg[(v_index ->> p.dep)::int + 1] > 0
             LIMIT 1;
            EXIT WHEN v_names[v_cur] = ANY (v_cycle);
            v_cycle := v_cycle || v_names[v_cur];
        END LOOP;
        -- Keep only the loop itself, shown in dependency direction (parent -> child).
        v_cycle := v_cycle[array_position(v_cycle, v_names[v_cur]):] || v_names[v_cur];
        SELECT array_agg(x ORDER BY o DESC) INTO v_cycle FROM unnest(v_cycle) WITH ORDINALITY AS u(x, o);
        PERFORM stepready._definition_error(
            format('steps[%s] "%s": depends_on', v_index ->> v_cycle[1], v_cycle[1]),
            format('dependency cycle %s', (SELECT string_agg(format('"%s"', x), ' -> ' ORDER BY o)
                                             FROM unnest(v_cycle) WITH ORDINALITY AS u(x, o))));
    END IF;
    RETURN v_order;
END;
$$;

-- Validates a definition without writing anything; raises the first problem found (SQLSTATE 22023).
CREATE OR REPLACE FUNCTION stepready.validate_task_definition(p_definition jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    PERFORM stepready._check_definition(p_definition);
END;
$$;

-- Bulk creation (SPEC §12). create_tasks and create_task share _create_tasks, which validates every definition
-- first and then writes all of them with one INSERT per table: the tasks, then their steps, then their edges.
-- Nothing here reads a table by anything but a key, so the cost of a task depends neither on how many rows the
-- tables hold nor on whether they were ever analyzed; the statements that read tables join them to arrays built
-- from the definitions, and the function turns sequential scans and hash or merge joins off to make that hold
-- whatever the planner believes. (It is set once per call, not per row.)
--
-- p_prefix names each element in error messages (`definitions[3]: steps[1] "load": ...`); create_task passes
-- false, so a single definition's messages stay as they always were.
CREATE OR REPLACE FUNCTION stepready._create_tasks(p_definitions jsonb, p_prefix bool)
RETURNS TABLE (ordinal int, task_id bigint, created bool)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_n        int;
    v_i        int := 0;
    v_d        jsonb;
    v_order    text[];
    -- Topological position of every step of every definition: parallel arrays (definition ordinal, name, pos).
    v_topo_ord int[] := '{}';
    v_topo_nm  text[] := '{}';
    v_topo_pos int[] := '{}';
    v_keys     text[];
    v_ex_keys  text[];
    v_ex_ids   bigint[];
    v_new_ords int[];
    v_new_ids  bigint[];
    v_ins_ids  bigint[];
    v_st_ids   bigint[];
    v_st_tasks bigint[];
    v_st_names text[];
    v_lost     text[];
    v_state    text;
    v_msg      text;
    v_detail   text;
    v_hint     text;
    v_max      bigint;
    v_size     bigint;
BEGIN
    IF p_definitions IS NULL OR jsonb_typeof(p_definitions) <> 'array' THEN
        PERFORM stepready._definition_error('definitions',
            format('must be a JSON array of task definitions, got %s', COALESCE(jsonb_typeof(p_definitions), 'NULL')));
    END IF;
    v_n := jsonb_array_length(p_definitions);
    IF v_n = 0 THEN
        RETURN;
    END IF;

    -- 1. Validate everything before writing anything. One exception block for the whole loop (a block per
    -- element would open a subtransaction per element): it only adds the element's index to the message.
    v_max := COALESCE(NULLIF(current_setting('stepready.max_definition_bytes', true), '')::bigint, 1048576);
    BEGIN
        FOR v_d IN SELECT value FROM jsonb_array_elements(p_definitions) LOOP
            -- SPEC §17: a definition over the limit (1 MiB unless the setting stepready.max_definition_bytes says
            -- otherwise) is refused before anything else is looked at.
            v_size := octet_length(v_d::text);
            IF v_size > v_max THEN
                PERFORM stepready._definition_error('definition', format(
                    'is %s bytes, over the limit of %s bytes (setting stepready.max_definition_bytes)', v_size, v_max));
            END IF;
            v_order := stepready._check_definition(v_d);
            v_topo_ord := v_topo_ord || array_fill(v_i + 1, ARRAY[cardinality(v_order)]);
            v_topo_nm := v_topo_nm || v_order;
            v_topo_pos := v_topo_pos || ARRAY(SELECT generate_series(1, cardinality(v_order)));
            v_i := v_i + 1;
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        IF NOT p_prefix THEN
            RAISE;
        END IF;
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT, v_detail = PG_EXCEPTION_DETAIL,
                                v_hint = PG_EXCEPTION_HINT;
        v_msg := format('definitions[%s]: %s', v_i, v_msg);
        IF COALESCE(v_detail, '') = '' AND COALESCE(v_hint, '') = '' THEN
            RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_msg;
        END IF;
        RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_msg, DETAIL = COALESCE(v_detail, ''),
                              HINT = COALESCE(v_hint, '');
    END;

    -- 2. Idempotency. An element is created when it has no key, or when it is the first of the call with its key
    -- and no task holds that key yet; every other element answers with the id of the task that holds the key.
    SELECT array_agg(DISTINCT k) INTO v_keys
      FROM jsonb_array_elements(p_definitions) AS e(x), LATERAL (SELECT e.x ->> 'idempotency_key' AS k) kk
     WHERE k IS NOT NULL;
    IF v_keys IS NOT NULL THEN
        SELECT array_agg(t.idempotency_key), array_agg(t.id) INTO v_ex_keys, v_ex_ids
          FROM unnest(v_keys) AS k(key)
          JOIN stepready.tasks t ON t.idempotency_key = k.key;
    END IF;
    SELECT array_agg(s.ord ORDER BY s.ord) INTO v_new_ords
      FROM (SELECT e.ord::int AS ord, e.x ->> 'idempotency_key' AS key,
                   min(e.ord) OVER (PARTITION BY e.x ->> 'idempotency_key') AS first
              FROM jsonb_array_elements(p_definitions) WITH ORDINALITY AS e(x, ord)) s
     WHERE s.key IS NULL OR (s.ord = s.first AND NOT s.key = ANY (COALESCE(v_ex_keys, '{}')));

    -- 3. The tasks. Ids are drawn first, in input order, so each id is known to belong to its element whatever
    -- ON CONFLICT skips: a key taken meanwhile by a concurrent creator (committed by now: the insert waited on its
    -- index entry) is looked up below.
    IF v_new_ords IS NOT NULL THEN
        SELECT array_agg(nextval(pg_get_serial_sequence('stepready.tasks', 'id')) ORDER BY o)
          INTO v_new_ids FROM unnest(v_new_ords) AS o;
        WITH ins AS (
            INSERT INTO stepready.tasks (id, name, namespace, context, priority, retry, idempotency_key, run_at)
            OVERRIDING SYSTEM VALUE
            SELECT n.id, d ->> 'name', COALESCE(d ->> 'namespace', 'default'),
                   COALESCE(NULLIF(d -> 'context', 'null'), '{}'), COALESCE((d ->> 'priority')::numeric::int, 0),
                   NULLIF(d -> 'retry', 'null'), d ->> 'idempotency_key',
                   stepready._json_run_at(d -> 'run_at', 'run_at')
              FROM unnest(v_new_ords, v_new_ids) AS n(ord, id)
              CROSS JOIN LATERAL (SELECT p_definitions -> (n.ord - 1) AS d) dd
             ORDER BY n.ord
            ON CONFLICT (idempotency_key) DO NOTHING
            RETURNING id
        )
        SELECT array_agg(id) INTO v_ins_ids FROM ins;
        -- Later elements with the key of a task created here answer with its id.
        SELECT v_ex_keys || array_agg(d ->> 'idempotency_key'), v_ex_ids || array_agg(n.id)
          INTO v_ex_keys, v_ex_ids
          FROM unnest(v_new_ords, v_new_ids) AS n(ord, id)
         CROSS JOIN LATERAL (SELECT p_definitions -> (n.ord - 1) AS d) dd
         WHERE n.id = ANY (COALESCE(v_ins_ids, '{}')) AND d ->> 'idempotency_key' IS NOT NULL;

        -- 4. Their steps, in definition order (a step's id follows its position: internal/store relies on it).
        IF v_ins_ids IS NOT NULL THEN
            WITH ins AS (
                INSERT INTO stepready.steps (task_id, name, handler, input, max_attempts, retryable, backoff,
                                             base_delay_ms, multiplier, max_delay_ms, jitter, retry_policy,
                                             timeout_ms, on_exhausted, rules, max_iterations, collect, queue,
                                             priority, breaker_limit, concurrency_key, concurrency_limit,
                                             rate_key, rate_limit, rate_period_ms)
                SELECT n.id, st ->> 'name', st ->> 'handler', COALESCE(NULLIF(st -> 'input', 'null'), '{}'),
                       (st -> 'retry' ->> 'max_attempts')::numeric::int, (st -> 'retry' ->> 'retryable')::bool,
                       st -> 'retry' ->> 'backoff', (st -> 'retry' ->> 'base_delay_ms')::numeric::bigint,
                       (st -> 'retry' ->> 'multiplier')::float8, (st -> 'retry' ->> 'max_delay_ms')::numeric::bigint,
                       (st -> 'retry' ->> 'jitter')::float8, st -> 'retry' ->> 'policy',
                       (st ->> 'timeout_ms')::numeric::bigint, st ->> 'on_exhausted', NULLIF(st -> 'rules', 'null'),
                       (st ->> 'max_iterations')::numeric::int, st ->> 'collect', st ->> 'queue',
                       (st ->> 'priority')::numeric::int, (st ->> 'breaker_limit')::numeric::int,
                       fc.c ->> 'key', (fc.c ->> 'limit')::numeric::int,
                       fc.r ->> 'key', (fc.r ->> 'limit')::numeric::int, (fc.r ->> 'period_ms')::numeric::bigint
                  FROM unnest(v_new_ords, v_new_ids) AS n(ord, id)
                 CROSS JOIN LATERAL jsonb_array_elements(p_definitions -> (n.ord - 1) -> 'steps')
                       WITH ORDINALITY AS e(st, sord)
                 -- SPEC §14: a step's own flow control, else its task's (placeholders resolved by the trigger).
                 CROSS JOIN LATERAL (
                    SELECT COALESCE(NULLIF(st -> 'concurrency', 'null'),
                                    NULLIF(p_definitions -> (n.ord - 1) -> 'concurrency', 'null')) AS c,
                           COALESCE(NULLIF(st -> 'rate_limit', 'null'),
                                    NULLIF(p_definitions -> (n.ord - 1) -> 'rate_limit', 'null')) AS r) fc
                 WHERE n.id = ANY (v_ins_ids)
                 ORDER BY n.ord, e.sord
                RETURNING id, task_id, name
            )
            SELECT array_agg(id), array_agg(task_id), array_agg(name) INTO v_st_ids, v_st_tasks, v_st_names
              FROM ins;

            -- 5. Their edges, each task's in topological order of the child: when a step's incoming edges are
            -- inserted it has no outgoing edges yet, so the cycle check of the edge trigger has nothing to walk.
            -- The step ids come from the insert above, not from a read of steps.
            INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
            SELECT p.id, c.id
              FROM unnest(v_new_ords, v_new_ids) AS n(ord, tid)
             CROSS JOIN LATERAL jsonb_array_elements(p_definitions -> (n.ord - 1) -> 'steps') AS e(st)
             CROSS JOIN LATERAL jsonb_array_elements_text(COALESCE(NULLIF(e.st -> 'depends_on', 'null'), '[]'))
                   AS dep(name)
              JOIN unnest(v_st_ids, v_st_tasks, v_st_names) AS c(id, task_id, name)
                ON c.task_id = n.tid AND c.name = e.st ->> 'name'
              JOIN unnest(v_st_ids, v_st_tasks, v_st_names) AS p(id, task_id, name)
                ON p.task_id = n.tid AND p.name = dep.name
              JOIN unnest(v_topo_ord, v_topo_nm, v_topo_pos) AS topo(ord, name, pos)
                ON topo.ord = n.ord AND topo.name = c.name
             WHERE n.tid = ANY (v_ins_ids)
             ORDER BY n.ord, topo.pos, p.id;
        END IF;
    END IF;

    -- 6. One row per element, in input order. Keys whose task was neither found in step 2 nor created here were
    -- taken by a concurrent creator that committed meanwhile.
    SELECT array_agg(DISTINCT d ->> 'idempotency_key') INTO v_lost
      FROM unnest(v_new_ords, v_new_ids) AS n(ord, id)
     CROSS JOIN LATERAL (SELECT p_definitions -> (n.ord - 1) AS d) dd
     WHERE NOT n.id = ANY (COALESCE(v_ins_ids, '{}'));
    IF v_lost IS NOT NULL THEN
        SELECT v_ex_keys || array_agg(t.idempotency_key), v_ex_ids || array_agg(t.id) INTO v_ex_keys, v_ex_ids
          FROM unnest(v_lost) AS k(key)
          JOIN stepready.tasks t ON t.idempotency_key = k.key;
    END IF;
    RETURN QUERY
    SELECT e.ord::int,
           COALESCE(c.id, x.id),
           c.id IS NOT NULL AND c.id = ANY (COALESCE(v_ins_ids, '{}'))
      FROM jsonb_array_elements(p_definitions) WITH ORDINALITY AS e(d, ord)
      LEFT JOIN unnest(v_new_ords, v_new_ids) AS c(ord, id)
             ON c.ord = e.ord AND c.id = ANY (COALESCE(v_ins_ids, '{}'))
      LEFT JOIN unnest(v_ex_keys, v_ex_ids) AS x(key, id) ON x.key = e.d ->> 'idempotency_key'
     ORDER BY e.ord;
END;
$$;

-- Creates the tasks of a JSON array of definitions (SPEC §12): one row per element, in input order, all or
-- nothing, errors naming definitions[i]. See _create_tasks.
CREATE OR REPLACE FUNCTION stepready.create_tasks(p_definitions jsonb)
RETURNS TABLE (ordinal int, task_id bigint, created bool)
LANGUAGE sql
AS $$
    SELECT * FROM stepready._create_tasks(p_definitions, true);
$$;

-- Creates a task from one JSON document and returns its id: the one-element case of create_tasks, with the
-- messages of a single definition (no definitions[0] prefix). An idempotency key already used returns the
-- existing task and creates nothing.
CREATE OR REPLACE FUNCTION stepready.create_task(p_definition jsonb)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT c.task_id FROM stepready._create_tasks(jsonb_build_array(p_definition), false) AS c;
$$;
CREATE OR REPLACE FUNCTION stepready._task_templates_validate()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    BEGIN
        PERFORM stepready._check_definition(
            NEW.definition || jsonb_build_object('name', COALESCE(NEW.definition ->> 'name', NEW.name)));
    EXCEPTION WHEN invalid_parameter_value THEN
        RAISE EXCEPTION 'template "%" version %: %', NEW.name, NEW.version, SQLERRM USING ERRCODE = '22023';
    END;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER task_templates_validate
    BEFORE INSERT OR UPDATE ON stepready.task_templates
    FOR EACH ROW EXECUTE FUNCTION stepready._task_templates_validate();

-- The definition a template gives for one context: the newest version's definition, named after the template
-- unless it names itself, with p_context merged over its context (top-level keys of p_context win; a non-object
-- p_context replaces it) and p_idempotency_key set when not NULL.
CREATE OR REPLACE FUNCTION stepready._template_definition(p_template jsonb, p_name text, p_context jsonb,
                                                         p_idempotency_key text)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT p_template
           || jsonb_build_object('name', COALESCE(p_template ->> 'name', p_name))
           || CASE WHEN p_context IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('context',
                            CASE WHEN jsonb_typeof(p_context) = 'object' AND jsonb_typeof(p_template -> 'context') = 'object'
                                 THEN (p_template -> 'context') || p_context
                                 ELSE p_context END) END
           || CASE WHEN p_idempotency_key IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('idempotency_key', p_idempotency_key) END;
$$;

-- The newest definition of template p_name; raises P0002 when there is none.
CREATE OR REPLACE FUNCTION stepready._template_newest(p_name text)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    d jsonb;
BEGIN
    SELECT definition INTO d FROM stepready.task_templates WHERE name = p_name ORDER BY version DESC LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'template "%" does not exist', p_name USING ERRCODE = 'P0002';
    END IF;
    RETURN d;
END;
$$;

-- Creates a task from the newest version of a template (see _template_definition for how p_context applies).
CREATE OR REPLACE FUNCTION stepready.create_task_from_template(p_name text, p_context jsonb,
                                                               p_idempotency_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT stepready.create_task(
        stepready._template_definition(stepready._template_newest(p_name), p_name, p_context, p_idempotency_key));
$$;

-- Creates one task per element of the JSON array p_contexts from the newest version of a template, as
-- create_tasks does (SPEC §12): one row per context in input order, all or nothing. p_idempotency_keys, when
-- given, pairs with the contexts by position (a NULL element means no key); its length must match.
CREATE OR REPLACE FUNCTION stepready.create_tasks_from_template(p_name text, p_contexts jsonb,
                                                                p_idempotency_keys text[] DEFAULT NULL)
RETURNS TABLE (ordinal int, task_id bigint, created bool)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_template jsonb;
BEGIN
    IF p_contexts IS NULL OR jsonb_typeof(p_contexts) <> 'array' THEN
        PERFORM stepready._definition_error('contexts',
            format('must be a JSON array of contexts, got %s', COALESCE(jsonb_typeof(p_contexts), 'NULL')));
    END IF;
    IF p_idempotency_keys IS NOT NULL
       AND cardinality(p_idempotency_keys) <> jsonb_array_length(p_contexts) THEN
        PERFORM stepready._definition_error('idempotency_keys',
            format('has %s keys for %s contexts: pass one key per context (NULL for none), or no keys',
                   cardinality(p_idempotency_keys), jsonb_array_length(p_contexts)));
    END IF;
    v_template := stepready._template_newest(p_name);
    RETURN QUERY
    SELECT c.ordinal, c.task_id, c.created
      FROM stepready.create_tasks(
               (SELECT COALESCE(jsonb_agg(stepready._template_definition(v_template, p_name, e.ctx,
                                                                        p_idempotency_keys[e.ord]) ORDER BY e.ord),
                                '[]')
                  FROM jsonb_array_elements(p_contexts) WITH ORDINALITY AS e(ctx, ord))) AS c;
END;
$$;
