-- Task definitions (SPEC §10, §12): JSON documents → tasks, validated completely before anything is written.
--
-- Validation is set-based: _validate_definitions checks every definition of a call in a handful of statements
-- (definition fields; step fields; names and dependencies; cycles), each rule written once as a *_problem
-- function (sql/020_policy.sql) that the planner inlines. Errors are the first problem of the first invalid
-- definition, in the order of its fields, exactly as a check of one definition after the other would find it.
-- _create_tasks then writes the tasks, their steps (policy and flow columns materialized, pending parents counted)
-- and their edges with one INSERT each, and notifies: no trigger function runs for those rows
-- (sql/018_validated_write.sql).

-- The earlier per-definition validator and its rule checker (PL/pgSQL loops per definition, step and rule).
DROP FUNCTION IF EXISTS stepready._check_definition(jsonb);
DROP FUNCTION IF EXISTS stepready._validate_rules(jsonb, text);
DROP FUNCTION IF EXISTS stepready._json_run_at(jsonb, text);

-- What is wrong with a definition's run_at (SPEC §15; what it does: sql/120_run_at.sql): an RFC 3339 timestamp string ("2026-11-24T02:30:00Z", "…+01:00",
-- fractional seconds allowed; the offset is required so the instant never depends on the session's time zone).
-- NULL for an acceptable value, an absent or null field included. A string of the right shape that is no time
-- ("2026-02-30T…") is only found by the cast, hence PL/pgSQL and its exception block; it runs for definitions
-- that have a run_at.
CREATE OR REPLACE FUNCTION stepready._run_at_problem(p_value jsonb)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_text text;
    v_at   timestamptz;
BEGIN
    IF p_value IS NULL OR jsonb_typeof(p_value) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) <> 'string' THEN
        RETURN format('must be an RFC 3339 timestamp string, got %s', jsonb_typeof(p_value));
    END IF;
    v_text := p_value #>> '{}';
    IF v_text !~ '^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$' THEN
        RETURN format('must be an RFC 3339 timestamp with an offset (2026-11-24T02:30:00Z), got "%s"', v_text);
    END IF;
    BEGIN
        v_at := v_text::timestamptz;
    EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format THEN
        RETURN format('is not a valid time: "%s"', v_text);
    END;
    RETURN NULL;
END;
$$;

-- What is wrong with a rule's action (the object under then or else), as a whole message.
CREATE OR REPLACE FUNCTION stepready._rule_action_problem(p_action jsonb, p_where text)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN jsonb_typeof(p_action) IS DISTINCT FROM 'object' THEN p_where || ': must be an object with a "do" field'
        WHEN COALESCE(p_action ->> 'do', '') NOT IN ('retry', 'fail', 'continue', 'repeat', 'break')
            THEN format('%s.do: must be one of retry, fail, continue, repeat, break, got %s', p_where,
                        COALESCE(p_action -> 'do', 'null'))
    END;
$$;

-- What is wrong with a rules list (SPEC §8), as a whole message starting with p_where, or NULL. CEL expressions
-- themselves are compiled by the Go entry points; SQL checks only what it can: an array of {when, then} objects
-- with an optional final {else}. The first problem of the first bad rule. (PL/pgSQL: its query keeps it from
-- being inlined, and a LANGUAGE sql function that is not is parsed and planned at every call.)
CREATE OR REPLACE FUNCTION stepready._rules_problem(p_rules jsonb, p_where text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN CASE
        WHEN p_rules IS NULL OR jsonb_typeof(p_rules) = 'null' THEN NULL
        WHEN jsonb_typeof(p_rules) <> 'array'
            THEN format('%s: must be an array of rules, got %s', p_where, jsonb_typeof(p_rules))
        ELSE (SELECT p.m
                FROM jsonb_array_elements(p_rules) WITH ORDINALITY AS x(r, o)
               CROSS JOIN LATERAL (SELECT format('%s[%s]', p_where, x.o - 1) AS w) w
               CROSS JOIN LATERAL (SELECT CASE
                    WHEN jsonb_typeof(x.r) <> 'object' THEN w.w || ': must be an object {when, then} or {else}'
                    WHEN x.r ? 'else' THEN COALESCE(
                        w.w || ': ' || stepready._unknown_keys_problem(x.r, ARRAY['else']),
                        CASE WHEN x.o <> jsonb_array_length(p_rules) THEN w.w || ': else must be the last rule' END,
                        stepready._rule_action_problem(x.r -> 'else', w.w || '.else'))
                    ELSE COALESCE(
                        w.w || ': ' || stepready._unknown_keys_problem(x.r, ARRAY['when', 'then']),
                        w.w || '.when: ' || stepready._text_problem(x.r -> 'when'),
                        CASE WHEN x.r ->> 'when' IS NULL OR NOT x.r ? 'then'
                             THEN w.w || ': a rule needs both when and then' END,
                        stepready._rule_action_problem(x.r -> 'then', w.w || '.then'))
                    END AS m) p
               WHERE p.m IS NOT NULL
               ORDER BY x.o
               LIMIT 1)
    END;
END;
$$;

-- The checks of a definition come in two compositions of the same per-field checks. The full one (the
-- *_problem functions below, evaluated inside PL/pgSQL by _definition_check and _step_check) covers every field,
-- in the order the messages promise. The plain one covers the definitions and steps that use only the common
-- fields (_plain_definition, _plain_step): it is small enough to sit inline in the set-based statements of
-- _validate_definitions, whose cost would otherwise be dominated by compiling the full expressions at every
-- execution (about 0.5 ms for one definition). Each field's rule is one function used by both.

-- The task-level fields a plain definition may have (anything else takes the full check).
CREATE OR REPLACE FUNCTION stepready._plain_definition(p_definition jsonb)
RETURNS bool
LANGUAGE sql IMMUTABLE
AS $$
    SELECT jsonb_typeof(p_definition) = 'object'
       AND p_definition - ARRAY['name', 'namespace', 'context', 'priority', 'idempotency_key', 'steps'] = '{}'::jsonb;
$$;

-- What is wrong with a definition's name, namespace, context, priority or idempotency key (in that order), as a
-- whole message, or NULL.
CREATE OR REPLACE FUNCTION stepready._definition_head_problem(p_definition jsonb)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT COALESCE(
        'name: ' || stepready._text_problem(p_definition -> 'name'),
        CASE WHEN p_definition ->> 'name' IS NULL THEN 'name: is required' END,
        'namespace: ' || stepready._text_problem(p_definition -> 'namespace'),
        CASE WHEN jsonb_typeof(p_definition -> 'context') NOT IN ('object', 'null')
             THEN format('context: must be an object, got %s', jsonb_typeof(p_definition -> 'context')) END,
        'priority: ' || stepready._integer_problem(p_definition -> 'priority', -2147483648, 2147483647),
        'idempotency_key: ' || stepready._text_problem(p_definition -> 'idempotency_key'));
$$;

-- What is wrong with a definition's steps field itself (not the steps), as a whole message, or NULL.
CREATE OR REPLACE FUNCTION stepready._definition_steps_problem(p_definition jsonb)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN jsonb_typeof(p_definition -> 'steps') IS DISTINCT FROM 'array'
                THEN 'steps: must be a non-empty array of steps'
                WHEN jsonb_array_length(p_definition -> 'steps') = 0
                THEN 'steps: must be a non-empty array of steps' END;
$$;

-- What is wrong with the task-level fields of a definition (everything but the steps' contents), as a whole
-- message, or NULL. p_presets: _presets().
CREATE OR REPLACE FUNCTION stepready._definition_problem(p_definition jsonb, p_presets jsonb)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN jsonb_typeof(p_definition) IS DISTINCT FROM 'object' THEN 'definition: must be a JSON object'
        ELSE COALESCE(
            'definition: ' || stepready._unknown_keys_problem(p_definition,
                ARRAY['name', 'namespace', 'context', 'priority', 'idempotency_key', 'retry', 'steps', 'run_at',
                      'concurrency', 'rate_limit']),
            stepready._definition_head_problem(p_definition),
            -- SPEC §15 (a PL/pgSQL call: only for a definition that has a run_at).
            CASE WHEN p_definition ? 'run_at' THEN 'run_at: ' || stepready._run_at_problem(p_definition -> 'run_at') END,
            stepready._retry_problem(p_definition -> 'retry', 'retry', p_presets),
            -- SPEC §14: the task's flow control is the default of its steps; placeholders are checked per step.
            stepready._flow_problem(p_definition -> 'concurrency', 'concurrency', 'concurrency', NULL, NULL),
            stepready._flow_problem(p_definition -> 'rate_limit', 'rate_limit', 'rate_limit', NULL, NULL),
            stepready._definition_steps_problem(p_definition))
    END;
$$;

-- _definition_problem, evaluated in PL/pgSQL: its expression is compiled once per transaction, not in every
-- statement that checks a definition.
CREATE OR REPLACE FUNCTION stepready._definition_check(p_definition jsonb, p_presets jsonb)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN stepready._definition_problem(p_definition, p_presets);
END;
$$;

-- The step fields a plain step may have; its task must have no flow control either (the task's applies to the
-- step, placeholders and all).
CREATE OR REPLACE FUNCTION stepready._plain_step(p_step jsonb, p_definition jsonb)
RETURNS bool
LANGUAGE sql IMMUTABLE
AS $$
    SELECT jsonb_typeof(p_step) = 'object'
       AND p_step - ARRAY['name', 'handler', 'input', 'depends_on'] = '{}'::jsonb
       AND NOT p_definition ?| ARRAY['concurrency', 'rate_limit'];
$$;

-- The per-field checks of a step take the field's value (JSON null and absent alike: SQL NULL or JSON null), so
-- that the set-based statements extract each field once (jsonb_to_record) instead of looking it up in every
-- check.

-- What is wrong with a step's name (p_name: the value of its "name"), as the end of a message starting with
-- `steps[i]`.
CREATE OR REPLACE FUNCTION stepready._step_name_problem(p_name jsonb)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN jsonb_typeof(p_name) = 'string' AND p_name #>> '{}' <> '' THEN NULL  -- the common case, first
                WHEN stepready._text_problem(p_name) IS NOT NULL THEN ': name: ' || stepready._text_problem(p_name)
                ELSE ': name: is required' END;
$$;

-- What is wrong with a step's handler, as the end of a message starting with `steps[i] "name"`: a non-empty
-- string, at most _max_name_chars() characters (sql/015_bounds.sql: a metric label and a River job field).
CREATE OR REPLACE FUNCTION stepready._step_handler_problem(p_handler jsonb)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN jsonb_typeof(p_handler) = 'string' AND p_handler #>> '{}' <> ''
                     AND char_length(p_handler #>> '{}') <= 255 THEN NULL  -- the common case, first
                WHEN stepready._text_problem(p_handler) IS NOT NULL THEN ': handler: ' || stepready._text_problem(p_handler)
                WHEN p_handler IS NULL OR jsonb_typeof(p_handler) = 'null' THEN ': handler: is required'
                ELSE ': handler: ' || stepready._name_problem(p_handler #>> '{}') END;
$$;

-- What is wrong with the type of a step's depends_on (its names are checked with the other steps), as the end of
-- a message starting with `steps[i] "name"`.
CREATE OR REPLACE FUNCTION stepready._step_depends_on_problem(p_depends_on jsonb)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN jsonb_typeof(p_depends_on) NOT IN ('array', 'null')
                THEN ': depends_on: must be an array of step names' END;
$$;

-- What is wrong with a plain step (_plain_step), given its name, handler and depends_on, as the end of a message
-- starting with `steps[i]`.
CREATE OR REPLACE FUNCTION stepready._plain_step_problem(p_name jsonb, p_handler jsonb, p_depends_on jsonb)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT COALESCE(stepready._step_name_problem(p_name),
                    ' "' || (p_name #>> '{}') || '"'
                        || COALESCE(stepready._step_handler_problem(p_handler),
                                    stepready._step_depends_on_problem(p_depends_on)));
$$;

-- What is wrong with the fields of a step that is an object with a name (p_where: `steps[2] "load"`), as a whole
-- message, or NULL. p_definition is the step's definition (the task's flow control and context), p_presets
-- _presets(). Dependencies are checked with the other steps (_validate_definitions). PL/pgSQL, not SQL: called
-- from PL/pgSQL (_step_check) a SQL function is not inlined, and this one was parsed and planned again for every
-- step that is not plain (8.5 ms a call with the machine at load 15-20, 0.7-1.1 ms in PL/pgSQL at the same load:
-- pg_stat_user_functions); PL/pgSQL plans its expression once per session.
CREATE OR REPLACE FUNCTION stepready._step_fields_problem(p_step jsonb, p_where text, p_definition jsonb,
                                                          p_presets jsonb)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN COALESCE(
        p_where || ': ' || stepready._unknown_keys_problem(p_step,
            ARRAY['name', 'handler', 'input', 'depends_on', 'retry', 'timeout_ms', 'on_exhausted', 'rules',
                  'max_iterations', 'collect', 'queue', 'priority', 'breaker_limit', 'concurrency', 'rate_limit',
                  'map', 'wait']),
        -- SPEC §19 (sql/058_map.sql).
        CASE WHEN p_step ? 'map' THEN p_where || ': map' || stepready._map_problem(p_step -> 'map',
            ARRAY(SELECT d.v #>> '{}' FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p_step -> 'depends_on') = 'array'
                                                                     THEN p_step -> 'depends_on' END) AS d(v))) END,
        -- SPEC §20 (sql/059_signals.sql): a wait step has no handler.
        CASE WHEN p_step ? 'wait' THEN COALESCE(p_where || stepready._wait_step_problem(p_step),
            p_where || ': wait' || stepready._wait_problem(p_step -> 'wait',
                ARRAY(SELECT d.v #>> '{}' FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p_step -> 'depends_on') = 'array'
                                                                         THEN p_step -> 'depends_on' END) AS d(v))))
             ELSE p_where || stepready._step_handler_problem(p_step -> 'handler') END,
        stepready._retry_problem(p_step -> 'retry', p_where || ': retry', p_presets),
        p_where || ': timeout_ms: ' || stepready._duration_ms_problem(p_step -> 'timeout_ms', 1),
        p_where || ': on_exhausted: ' || stepready._text_problem(p_step -> 'on_exhausted'),
        CASE WHEN p_step ->> 'on_exhausted' NOT IN ('fail_task', 'skip', 'skip_cascade')
             THEN format('%s: on_exhausted: must be fail_task, skip or skip_cascade, got %s', p_where,
                         p_step -> 'on_exhausted') END,
        CASE WHEN p_step ? 'rules' THEN stepready._rules_problem(p_step -> 'rules', p_where || ': rules') END,
        p_where || ': max_iterations: ' || stepready._integer_problem(p_step -> 'max_iterations', 1, 2147483647),
        p_where || ': collect: ' || stepready._text_problem(p_step -> 'collect'),
        CASE WHEN p_step ->> 'collect' NOT IN ('append', 'replace', 'merge')
             THEN format('%s: collect: must be append, replace or merge, got %s', p_where, p_step -> 'collect') END,
        p_where || ': queue: ' || stepready._text_problem(p_step -> 'queue'),
        -- A River queue name (sql/015_bounds.sql: River refuses a whole InsertManyTx for one bad name).
        CASE WHEN p_step ->> 'queue' <> 'default' THEN p_where || ': queue: ' || stepready._queue_problem(p_step ->> 'queue') END,
        p_where || ': priority: ' || stepready._integer_problem(p_step -> 'priority', -2147483648, 2147483647),
        p_where || ': breaker_limit: ' || stepready._integer_problem(p_step -> 'breaker_limit', 0, 2147483647),
        -- The step's own flow control, else its task's, with the placeholders of its key resolved (a map step's
        -- ${element…} and ${index} are checked and kept: SPEC §19).
        CASE WHEN p_step ? 'concurrency' OR p_definition ? 'concurrency' THEN stepready._flow_problem(
            COALESCE(NULLIF(p_step -> 'concurrency', 'null'), p_definition -> 'concurrency'), 'concurrency',
            p_where || ': concurrency'
                || CASE WHEN NULLIF(p_step -> 'concurrency', 'null') IS NULL THEN ' (the task''s)' ELSE '' END,
            COALESCE(NULLIF(p_definition -> 'context', 'null'), '{}'),
            COALESCE(NULLIF(p_step -> 'input', 'null'), '{}'), p_step ? 'map') END,
        CASE WHEN p_step ? 'rate_limit' OR p_definition ? 'rate_limit' THEN stepready._flow_problem(
            COALESCE(NULLIF(p_step -> 'rate_limit', 'null'), p_definition -> 'rate_limit'), 'rate_limit',
            p_where || ': rate_limit'
                || CASE WHEN NULLIF(p_step -> 'rate_limit', 'null') IS NULL THEN ' (the task''s)' ELSE '' END,
            COALESCE(NULLIF(p_definition -> 'context', 'null'), '{}'),
            COALESCE(NULLIF(p_step -> 'input', 'null'), '{}'), p_step ? 'map') END,
        p_where || stepready._step_depends_on_problem(p_step -> 'depends_on'),
        -- SPEC §18: references in the input (sql/019_dataflow.sql); ${deps.NAME} must name a direct parent.
        CASE WHEN strpos((p_step -> 'input')::text, '${') > 0 THEN p_where || ': ' || stepready._input_refs_problem(
            p_step -> 'input',
            ARRAY(SELECT d.v #>> '{}' FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p_step -> 'depends_on') = 'array'
                                                                     THEN p_step -> 'depends_on' END) AS d(v)),
            p_step ? 'map') END);
END;
$$;

-- What is wrong with step p_index (0-based) of a definition, on its own, as a whole message, or NULL: the full
-- check, in PL/pgSQL (its expressions are compiled once per transaction).
CREATE OR REPLACE FUNCTION stepready._step_check(p_step jsonb, p_index int, p_definition jsonb, p_presets jsonb)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_problem text;
BEGIN
    IF jsonb_typeof(p_step) <> 'object' THEN
        RETURN format('steps[%s]: must be an object', p_index);
    END IF;
    v_problem := stepready._step_name_problem(p_step -> 'name');
    IF v_problem IS NOT NULL THEN
        RETURN format('steps[%s]', p_index) || v_problem;
    END IF;
    RETURN stepready._step_fields_problem(p_step, format('steps[%s] "%s"', p_index, p_step ->> 'name'),
                                          p_definition, p_presets);
END;
$$;

-- The dependency cycle of a definition whose names and dependencies are valid, as a whole message naming the
-- cycle in dependency order (`steps[1] "b": depends_on: dependency cycle "a" -> "b" -> "a"`), or NULL when it
-- has none. Kahn's algorithm, O(steps + edges), in PL/pgSQL: _validate_definitions calls it only for a definition
-- that lists a step before one of its parents (a definition whose steps all come after their parents has no
-- cycle, which one set-based statement shows for every definition of a call).
CREATE OR REPLACE FUNCTION stepready._cycle_problem(p_definition jsonb)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    d        jsonb := p_definition;
    v_n      int := jsonb_array_length(p_definition -> 'steps');
    v_names  text[];
    v_index  jsonb;          -- step name → 0-based position
    -- Kahn's algorithm over positions (1-based in the arrays).
    v_indeg  int[];
    v_kids   int[];          -- children of every step, grouped by parent (CSR layout)
    v_start  int[];          -- v_kids offsets: children of k are v_kids[v_start[k] .. v_start[k+1]-1]
    v_queue  int[];
    v_head   int := 1;
    v_done   int := 0;
    v_k      int;
    v_j      int;
    v_cycle  text[];
    v_cur    int;
BEGIN
    SELECT array_agg(e.x ->> 'name' ORDER BY e.ord), jsonb_object_agg(e.x ->> 'name', e.ord - 1),
           array_agg(jsonb_array_length(COALESCE(NULLIF(e.x -> 'depends_on', 'null'), '[]')) ORDER BY e.ord)
      INTO v_names, v_index, v_indeg
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
        v_done := v_done + 1;
        FOR v_j IN v_start[v_k] .. v_start[v_k + 1] - 1 LOOP
            v_indeg[v_kids[v_j]] := v_indeg[v_kids[v_j]] - 1;
            IF v_indeg[v_kids[v_j]] = 0 THEN
                v_queue := v_queue || v_kids[v_j];
            END IF;
        END LOOP;
    END LOOP;
    IF v_done = v_n THEN
        RETURN NULL;
    END IF;

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
    RETURN format('steps[%s] "%s": depends_on: dependency cycle %s', v_index ->> v_cycle[1], v_cycle[1],
                  (SELECT string_agg(format('"%s"', x), ' -> ' ORDER BY o) FROM unnest(v_cycle) WITH ORDINALITY AS u(x, o)));
END;
$$;

-- Validates the definitions of the JSON array p_definitions without writing anything, and raises the first
-- problem of the first invalid one (SQLSTATE 22023), prefixed with `definitions[i]: ` (0-based) when p_prefix.
-- Every message names the field and, for steps, the index and name: `steps[2] "load": depends_on: …`.
--
-- Set-based: each stage is one statement over every definition that passed the stages before and comes before the
-- first invalid one found so far, so the error is the one a check of the definitions one after the other would
-- raise first. Stages, in the order of the checks of one definition: 1. its size and task-level fields; 2. each
-- step on its own; 3. names unique, dependencies known, distinct, not the step itself; 4. no cycle. Plain
-- definitions and steps are checked inline, the others by the full checks (see _plain_definition); a call of
-- plain definitions that are all fine, each step after its parents, takes one statement (stage 0). It reads no
-- table but the presets (p_presets: _presets(), read here when NULL). Its statements are planned once per
-- session (generic plans), may hash the call's own rows (they read no table), and are never JIT-compiled.
CREATE OR REPLACE FUNCTION stepready._validate_definitions(p_definitions jsonb, p_prefix bool,
                                                           p_presets jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = on
SET enable_mergejoin = on
SET jit = off
AS $$
DECLARE
    v_n       int := jsonb_array_length(p_definitions);
    v_bound   int := jsonb_array_length(p_definitions) + 1; -- first invalid definition so far (1-based)
    v_msg     text;
    v_ord     int;
    v_m       text;
    v_max     bigint;
    v_presets jsonb := p_presets;
    v_forward int[];
    v_plain   bool;
BEGIN
    v_max := COALESCE(NULLIF(current_setting('stepready.max_definition_bytes', true), '')::bigint, 1048576);

    -- 0. The common case in one statement: every definition plain (_plain_definition) and within the size limit,
    -- every step plain (_plain_step) and fine, names unique, and every dependency the name of a step listed
    -- before it (so no cycle either). That holds only if stages 1 to 4 find nothing: they run when it does not,
    -- and say what is wrong.
    SELECT bool_and(COALESCE(k.ok, false)) INTO v_plain
      FROM jsonb_array_elements(p_definitions) AS e(d)
     -- The definition's text once: its size, and whether it holds `${` anywhere (references in an input, SPEC §18:
     -- such a definition takes the full checks).
     CROSS JOIN LATERAL (SELECT e.d::text AS txt OFFSET 0) dt
     CROSS JOIN LATERAL (
            SELECT octet_length(dt.txt) <= v_max AND strpos(dt.txt, '${') = 0 AND stepready._plain_definition(e.d)
                   AND stepready._definition_head_problem(e.d) IS NULL
                   AND stepready._definition_steps_problem(e.d) IS NULL AS ok,
                   CASE WHEN jsonb_typeof(e.d -> 'steps') = 'array' THEN e.d -> 'steps' END AS steps
            OFFSET 0) h
     CROSS JOIN LATERAL (
            -- Each name → its 1-based position; a repeated name maps to its last position.
            SELECT jsonb_object(array_agg(COALESCE(x.st ->> 'name', '')), array_agg(x.o::text)) AS names
              FROM jsonb_array_elements(h.steps) WITH ORDINALITY AS x(st, o)
             WHERE h.ok) nm
     CROSS JOIN LATERAL (
            SELECT h.ok AND bool_and(COALESCE(
                       f.plain AND stepready._plain_step_problem(f.name, f.handler, f.deps) IS NULL
                       AND (nm.names ->> (f.name #>> '{}'))::int = x.o
                       AND CASE WHEN jsonb_typeof(f.deps) IS DISTINCT FROM 'array' OR jsonb_array_length(f.deps) = 0
                                THEN true
                                WHEN jsonb_array_length(f.deps) = 1
                                    THEN jsonb_typeof(f.deps -> 0) = 'string'
                                         AND (nm.names ->> (f.deps ->> 0))::int < x.o
                                ELSE (SELECT bool_and(COALESCE(jsonb_typeof(dv.v) = 'string'
                                                               AND (nm.names ->> (dv.v #>> '{}'))::int < x.o,
                                                               false))
                                             AND count(*) = count(DISTINCT dv.v)
                                        FROM jsonb_array_elements(f.deps) AS dv(v)) END,
                       false)) AS ok
              FROM jsonb_array_elements(h.steps) WITH ORDINALITY AS x(st, o)
             -- Each field once (the checks use them several times each).
             CROSS JOIN LATERAL (SELECT stepready._plain_step(x.st, e.d) AS plain, x.st -> 'name' AS name,
                                        x.st -> 'handler' AS handler, x.st -> 'depends_on' AS deps OFFSET 0) f
             WHERE h.ok) k;
    IF v_plain THEN
        RETURN;
    END IF;
    -- Plain definitions name no preset: only the full checks need them.
    v_presets := COALESCE(v_presets, stepready._presets());

    -- 1. Size and task-level fields. SPEC §17: a definition over the limit (1 MiB unless the setting
    -- stepready.max_definition_bytes says otherwise) is refused before anything else is looked at.
    SELECT e.ord, p.m INTO v_ord, v_m
      FROM jsonb_array_elements(p_definitions) WITH ORDINALITY AS e(d, ord)
     CROSS JOIN LATERAL (SELECT CASE
                WHEN octet_length(e.d::text) > v_max THEN format(
                    'definition: is %s bytes, over the limit of %s bytes (setting stepready.max_definition_bytes)',
                    octet_length(e.d::text), v_max)
                WHEN stepready._plain_definition(e.d)
                    THEN COALESCE(stepready._definition_head_problem(e.d), stepready._definition_steps_problem(e.d))
                ELSE stepready._definition_check(e.d, v_presets) END AS m) p
     WHERE p.m IS NOT NULL
     ORDER BY e.ord
     LIMIT 1;
    IF FOUND THEN
        v_bound := v_ord;
        v_msg := v_m;
    END IF;

    -- 2. Each step on its own.
    SELECT e.ord, p.m INTO v_ord, v_m
      FROM jsonb_array_elements(p_definitions) WITH ORDINALITY AS e(d, ord)
     CROSS JOIN LATERAL jsonb_array_elements(e.d -> 'steps') WITH ORDINALITY AS s(st, o)
     CROSS JOIN LATERAL jsonb_to_record(CASE WHEN jsonb_typeof(s.st) = 'object' THEN s.st END)
           AS f(name jsonb, handler jsonb, depends_on jsonb)
     CROSS JOIN LATERAL (SELECT CASE
                WHEN stepready._plain_step(s.st, e.d) AND COALESCE(strpos((s.st -> 'input')::text, '${'), 0) = 0
                    THEN 'steps[' || (s.o - 1) || ']' || stepready._plain_step_problem(f.name, f.handler, f.depends_on)
                ELSE stepready._step_check(s.st, (s.o - 1)::int, e.d, v_presets) END AS m) p
     WHERE e.ord < v_bound AND p.m IS NOT NULL
     ORDER BY e.ord, s.o
     LIMIT 1;
    IF FOUND THEN
        v_bound := v_ord;
        v_msg := v_m;
    END IF;

    -- 3. Names and dependencies, per definition: a duplicate name first (the first step that repeats an earlier
    -- name), then each step's dependencies in order (a name, known, not its own), then whether it lists one
    -- twice. The definitions that list a step before one of its parents are kept for stage 4. Names are
    -- compared byte for byte (COLLATE "C"), as jsonb keys are.
    WITH s AS MATERIALIZED (
        SELECT e.ord::int AS ord, (x.o - 1)::int AS i, (x.st ->> 'name') COLLATE "C" AS name,
               CASE WHEN jsonb_typeof(x.st -> 'depends_on') = 'array' THEN x.st -> 'depends_on' END AS deps
          FROM jsonb_array_elements(p_definitions) WITH ORDINALITY AS e(d, ord)
         CROSS JOIN LATERAL jsonb_array_elements(e.d -> 'steps') WITH ORDINALITY AS x(st, o)
         WHERE e.ord < v_bound
    ), deps AS MATERIALIZED (
        SELECT s.ord, s.i, s.name, dep.v, dep.j, p.i AS parent
          FROM s
         CROSS JOIN LATERAL jsonb_array_elements(s.deps) WITH ORDINALITY AS dep(v, j)
          LEFT JOIN s p ON p.ord = s.ord AND p.name = (dep.v #>> '{}') COLLATE "C"
    ), problems AS (
        SELECT g.ord, 0 AS stage, (SELECT min(x) FROM unnest(g.idx) AS x WHERE x > g.first) AS i, 0::bigint AS j,
               format('steps[%s] "%s": name: duplicate step name (also steps[%s])',
                      (SELECT min(x) FROM unnest(g.idx) AS x WHERE x > g.first), g.name, g.first) AS m
          FROM (SELECT s.ord, s.name, min(s.i) AS first, array_agg(s.i) AS idx
                  FROM s GROUP BY s.ord, s.name HAVING count(*) > 1) g
        UNION ALL
        SELECT d.ord, 1, d.i, d.j, CASE
                   WHEN jsonb_typeof(d.v) <> 'string'
                       THEN format('steps[%s] "%s": depends_on: must contain step names, got %s', d.i, d.name, d.v)
                   WHEN d.parent IS NULL
                       THEN format('steps[%s] "%s": depends_on: unknown step "%s"', d.i, d.name, d.v #>> '{}')
                   ELSE format('steps[%s] "%s": depends_on: a step cannot depend on itself', d.i, d.name)
               END
          FROM deps d
         WHERE jsonb_typeof(d.v) <> 'string' OR d.parent IS NULL OR d.parent = d.i
        UNION ALL
        SELECT d.ord, 1, d.i, 9223372036854775807, format('steps[%s] "%s": depends_on: lists a step twice', d.i, d.name)
          FROM deps d
         GROUP BY d.ord, d.i, d.name
        HAVING count(*) <> count(DISTINCT d.v #>> '{}')
    ), first AS (
        SELECT p.ord, p.m FROM problems p ORDER BY p.ord, p.stage, p.i, p.j LIMIT 1
    )
    SELECT (SELECT f.ord FROM first f), (SELECT f.m FROM first f),
           (SELECT array_agg(DISTINCT d.ord ORDER BY d.ord) FROM deps d WHERE d.parent > d.i)
      INTO v_ord, v_m, v_forward;
    IF v_ord IS NOT NULL THEN
        v_bound := v_ord;
        v_msg := v_m;
    END IF;

    -- 4. Cycles, only where a step comes before one of its parents.
    IF v_forward IS NOT NULL THEN
        FOREACH v_ord IN ARRAY v_forward LOOP
            EXIT WHEN v_ord >= v_bound;
            v_m := stepready._cycle_problem(p_definitions -> (v_ord - 1));
            IF v_m IS NOT NULL THEN
                v_bound := v_ord;
                v_msg := v_m;
                EXIT;
            END IF;
        END LOOP;
    END IF;

    IF v_bound <= v_n THEN
        IF p_prefix THEN
            v_msg := format('definitions[%s]: %s', v_bound - 1, v_msg);
        END IF;
        RAISE EXCEPTION '%', v_msg USING ERRCODE = '22023';
    END IF;
END;
$$;

-- Validates a definition without writing anything; raises the first problem found (SQLSTATE 22023).
CREATE OR REPLACE FUNCTION stepready.validate_task_definition(p_definition jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    PERFORM stepready._validate_definitions(jsonb_build_array(p_definition), false);
END;
$$;

-- Bulk creation (SPEC §12). create_tasks and create_task share _create_tasks, which validates every definition
-- (_validate_definitions) and then writes all of them: one INSERT of the tasks (with their step counters), one of
-- their steps (every column the steps insert trigger would fill: policy resolved from the presets, flow control
-- with placeholders substituted, pending parents counted, run_at as first attempt time), one of their edges, and
-- one notification per task. The triggers of the plain-SQL path are not called for these rows
-- (sql/018_validated_write.sql): the cost of a task is that of its rows and index entries, the foreign-key checks
-- (an index probe each) and its share of the call's validation.
--
-- Nothing here reads a table but through an index (the task rows of idempotency keys, the presets), and none
-- of it may be planned otherwise, nor JIT-compiled, whatever the statistics say: sequential scans, hash and
-- merge joins and JIT are off for the whole call, foreign-key checks included (docs/design-core.md, "Settings
-- the functions pin"). Joins between the call's own rows are written as array subscripts and jsonb lookups, so
-- that with nested loops only they stay linear.
--
-- It runs as its owner (SECURITY DEFINER, search_path pinned) with stepready.validated_write on: that is what
-- lets its rows skip the triggers, and nothing else (sql/018_validated_write.sql).
--
-- p_prefix names each element in error messages (`definitions[3]: steps[1] "load": ...`); create_task passes
-- false, so a single definition's messages stay as they always were.
CREATE OR REPLACE FUNCTION stepready._create_tasks(p_definitions jsonb, p_prefix bool)
RETURNS TABLE (ordinal int, task_id bigint, created bool)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET stepready.validated_write = 'on'
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_n        int;
    v_known    jsonb;    -- idempotency key → id of the task that holds it
    v_keyed    bool;     -- some element has an idempotency key
    v_new_ords int[];    -- elements to create (1-based), ascending
    v_new_ids  bigint[]; -- their task ids, drawn in advance, ascending
    v_offs     int[];    -- where each one's steps start among v_sids (0-based)
    v_sids     bigint[]; -- their step ids, ascending, in definition order
    v_ins_ids  bigint[]; -- the task ids actually inserted (ON CONFLICT may skip some)
    v_ords     int[];    -- elements created, ascending
    v_tids     bigint[]; -- their task ids
    v_lost     text[];
    v_notified bigint;
    v_waits    bigint[];
BEGIN
    IF NOT stepready._validated_write() THEN
        RAISE EXCEPTION 'stepready._create_tasks does not run as the owner its triggers expect (was its owner changed '
                        'without `scheduler migrate up`?): run `scheduler migrate up`' USING ERRCODE = '55000';
    END IF;
    IF p_definitions IS NULL OR jsonb_typeof(p_definitions) <> 'array' THEN
        PERFORM stepready._definition_error('definitions',
            format('must be a JSON array of task definitions, got %s', COALESCE(jsonb_typeof(p_definitions), 'NULL')));
    END IF;
    v_n := jsonb_array_length(p_definitions);
    IF v_n = 0 THEN
        RETURN;
    END IF;

    -- 1. Validate everything before writing anything.
    PERFORM stepready._validate_definitions(p_definitions, p_prefix);

    -- 2. Idempotency. An element is created when it has no key, or when it is the first of the call with its key
    -- and no task holds that key yet; every other element answers with the id of the task that holds the key.
    -- Each key is looked up on its own (the unique index of tasks.idempotency_key).
    --
    -- 3. Ids for the elements to create, drawn here and handed out in ascending order: a task's follows its
    -- element's position, a step's its position in its definition (internal/store relies on it). Whatever ON
    -- CONFLICT skips below, each id is known to belong to its element. (The identity sequences are named in the
    -- query, resolved once when it is planned: pg_get_serial_sequence would read pg_depend at every call.)
    WITH e AS MATERIALIZED (
        SELECT x.ord::int AS ord, x.d ->> 'idempotency_key' AS key, jsonb_array_length(x.d -> 'steps') AS len
          FROM jsonb_array_elements(p_definitions) WITH ORDINALITY AS x(d, ord)
    ), known AS MATERIALIZED (
        SELECT COALESCE(jsonb_object_agg(k.key, k.id) FILTER (WHERE k.id IS NOT NULL), '{}') AS j, count(*) > 0 AS keyed
          FROM (SELECT u.key, (SELECT t.id FROM stepready.tasks t WHERE t.idempotency_key = u.key) AS id
                  FROM (SELECT DISTINCT e.key FROM e WHERE e.key IS NOT NULL) u) k
    ), o AS MATERIALIZED (
        SELECT s.ord, (sum(s.len) OVER (ORDER BY s.ord) - s.len)::int AS off, s.len
          FROM (SELECT e.ord, e.len, e.key, min(e.ord) OVER (PARTITION BY e.key) AS first FROM e) s, known
         WHERE s.key IS NULL OR (s.ord = s.first AND NOT known.j ? s.key)
    )
    SELECT known.j, known.keyed, (SELECT array_agg(o.ord ORDER BY o.ord) FROM o),
           (SELECT array_agg(o.off ORDER BY o.ord) FROM o),
           (SELECT array_agg(x.id ORDER BY x.id)
              FROM (SELECT nextval('stepready.tasks_id_seq'::regclass) AS id
                      FROM generate_series(1, (SELECT count(*) FROM o)::int)) x),
           (SELECT array_agg(x.id ORDER BY x.id)
              FROM (SELECT nextval('stepready.steps_id_seq'::regclass) AS id
                      FROM generate_series(1, (SELECT COALESCE(sum(o.len), 0) FROM o)::int)) x)
      INTO v_known, v_keyed, v_new_ords, v_offs, v_new_ids, v_sids
      FROM known;

    IF v_new_ords IS NOT NULL THEN
        -- 4. The tasks, with their step counters (every step starts pending, so unsatisfied), their steps and
        -- edges, and a notification per task, in one statement. A key taken meanwhile by a concurrent creator
        -- (committed by now: the insert waited on its index entry) skips its element, and its steps with it.
        --
        -- Per task (t): the retry fields its steps fall back on (its retry field, else its preset's, else
        -- standard's: SPEC §3) and its flow control. Per step: its own field, else its preset's, else the task's;
        -- flow control (its own, else the task's) with placeholders substituted; pending parents = its
        -- dependencies, all of them just created pending. A definition's steps are read with jsonb_to_recordset
        -- (every field of a step in one pass; JSON null reads as NULL); presets by name, through the primary key.
        -- The steps' foreign-key checks run at the end of the statement, when the tasks are in.
        WITH ins_tasks AS (
            INSERT INTO stepready.tasks (id, name, namespace, context, priority, retry, idempotency_key, run_at,
                                         steps_total, steps_unsatisfied)
            OVERRIDING SYSTEM VALUE
            SELECT n.id, dd.d ->> 'name', COALESCE(dd.d ->> 'namespace', 'default'),
                   COALESCE(NULLIF(dd.d -> 'context', 'null'), '{}'), COALESCE((dd.d ->> 'priority')::numeric::int, 0),
                   NULLIF(dd.d -> 'retry', 'null'), dd.d ->> 'idempotency_key', (dd.d ->> 'run_at')::timestamptz,
                   jsonb_array_length(dd.d -> 'steps'), jsonb_array_length(dd.d -> 'steps')
              FROM unnest(v_new_ords, v_new_ids) AS n(ord, id)
             CROSS JOIN LATERAL (SELECT p_definitions -> (n.ord - 1) AS d) dd
            ON CONFLICT (idempotency_key) DO NOTHING
            RETURNING id
        ), t AS MATERIALIZED (
            SELECT u.tid, u.off, dd.d -> 'steps' AS steps, (dd.d ->> 'run_at')::timestamptz AS run_at,
                   COALESCE((dd.d ->> 'priority')::numeric::int, 0) AS priority,
                   COALESCE(NULLIF(dd.d -> 'context', 'null'), '{}') AS context,
                   NULLIF(dd.d -> 'concurrency', 'null') AS concurrency, NULLIF(dd.d -> 'rate_limit', 'null') AS rate_limit,
                   COALESCE((tr.r ->> 'max_attempts')::numeric::int, (tr.p ->> 'max_attempts')::int,
                            (sd.p ->> 'max_attempts')::int, 3) AS max_attempts,
                   COALESCE((tr.r ->> 'retryable')::bool, (tr.p ->> 'retryable')::bool, (sd.p ->> 'retryable')::bool,
                            true) AS retryable,
                   COALESCE(tr.r ->> 'backoff', tr.p ->> 'backoff', sd.p ->> 'backoff', 'exponential') AS backoff,
                   COALESCE((tr.r ->> 'base_delay_ms')::numeric::bigint, (tr.p ->> 'base_delay_ms')::bigint,
                            (sd.p ->> 'base_delay_ms')::bigint, 1000) AS base_delay_ms,
                   COALESCE((tr.r ->> 'multiplier')::float8, (tr.p ->> 'multiplier')::float8,
                            (sd.p ->> 'multiplier')::float8, 2) AS multiplier,
                   COALESCE((tr.r ->> 'max_delay_ms')::numeric::bigint, (tr.p ->> 'max_delay_ms')::bigint,
                            (sd.p ->> 'max_delay_ms')::bigint, CASE WHEN sd.p IS NULL THEN 30000 END) AS max_delay_ms,
                   COALESCE((tr.r ->> 'jitter')::float8, (tr.p ->> 'jitter')::float8, (sd.p ->> 'jitter')::float8,
                            0) AS jitter,
                   COALESCE(tr.r ->> 'policy', 'standard') AS policy
              FROM unnest(v_new_ords, v_new_ids, v_offs) AS u(ord, tid, off)
             CROSS JOIN LATERAL (SELECT p_definitions -> (u.ord - 1) AS d) dd
             CROSS JOIN LATERAL (SELECT NULLIF(dd.d -> 'retry', 'null') AS r,
                                        CASE WHEN dd.d -> 'retry' ->> 'policy' IS NOT NULL
                                             THEN (SELECT to_jsonb(p) FROM stepready.retry_policies p
                                                    WHERE p.name = dd.d -> 'retry' ->> 'policy') END AS p) tr
             CROSS JOIN (SELECT (SELECT to_jsonb(p) FROM stepready.retry_policies p WHERE p.name = 'standard') AS p) sd
             -- Only the tasks inserted: with no key in the call, all of them (the lookup is then not made).
             WHERE NOT v_keyed OR (SELECT jsonb_object_agg(i.id::text, true) FROM ins_tasks i) ? u.tid::text
        ), ins_steps AS (
            INSERT INTO stepready.steps (id, task_id, name, handler, input, max_attempts, retryable, backoff,
                                         base_delay_ms, multiplier, max_delay_ms, jitter, retry_policy,
                                         next_attempt_at, timeout_ms, on_exhausted, rules, max_iterations, collect,
                                         queue, priority, breaker_limit, pending_parents, task_priority,
                                         concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period_ms)
            OVERRIDING SYSTEM VALUE
            -- A wait step (SPEC §20) has no handler: its column reads `wait` (its `wait` is written below).
            SELECT v_sids[t.off + s.ordinality], t.tid, s.name, COALESCE(s.handler, 'wait'), COALESCE(s.input, '{}'),
                   -- A wait step (no handler: the validation allows none other) has one attempt and no retry.
                   CASE WHEN s.handler IS NULL THEN 1
                        ELSE COALESCE((s.retry ->> 'max_attempts')::numeric::int, (f.sp ->> 'max_attempts')::int,
                                      t.max_attempts) END,
                   CASE WHEN s.handler IS NULL THEN false
                        ELSE COALESCE((s.retry ->> 'retryable')::bool, (f.sp ->> 'retryable')::bool, t.retryable) END,
                   COALESCE(s.retry ->> 'backoff', f.sp ->> 'backoff', t.backoff),
                   COALESCE((s.retry ->> 'base_delay_ms')::numeric::bigint, (f.sp ->> 'base_delay_ms')::bigint,
                            t.base_delay_ms),
                   COALESCE((s.retry ->> 'multiplier')::float8, (f.sp ->> 'multiplier')::float8, t.multiplier),
                   COALESCE((s.retry ->> 'max_delay_ms')::numeric::bigint, (f.sp ->> 'max_delay_ms')::bigint,
                            t.max_delay_ms),
                   COALESCE((s.retry ->> 'jitter')::float8, (f.sp ->> 'jitter')::float8, t.jitter),
                   COALESCE(s.retry ->> 'policy', t.policy),
                   -- SPEC §15: run_at delays the first attempt (sql/120_run_at.sql).
                   t.run_at,
                   s.timeout_ms::bigint, COALESCE(s.on_exhausted, 'fail_task'), s.rules, s.max_iterations::int,
                   COALESCE(s.collect, 'replace'), COALESCE(s.queue, 'default'), COALESCE(s.priority::int, 0),
                   COALESCE(s.breaker_limit::int, 3), COALESCE(jsonb_array_length(s.depends_on), 0), t.priority,
                   -- SPEC §14, sql/047_flow.sql (a map step keeps ${element…} and ${index} for its elements).
                   CASE WHEN strpos(f.fc ->> 'key', '${') > 0
                        THEN (stepready._flow_substitute(f.fc ->> 'key', t.context, COALESCE(s.input, '{}'),
                                                          s.map IS NOT NULL)).value
                        ELSE f.fc ->> 'key' END,
                   (f.fc ->> 'limit')::numeric::int,
                   CASE WHEN strpos(f.fr ->> 'key', '${') > 0
                        THEN (stepready._flow_substitute(f.fr ->> 'key', t.context, COALESCE(s.input, '{}'),
                                                          s.map IS NOT NULL)).value
                        ELSE f.fr ->> 'key' END,
                   (f.fr ->> 'limit')::numeric::int, (f.fr ->> 'period_ms')::numeric::bigint
              FROM t
             CROSS JOIN LATERAL ROWS FROM (jsonb_to_recordset(t.steps) AS (
                    name text, handler text, input jsonb, depends_on jsonb, retry jsonb, timeout_ms numeric,
                    on_exhausted text, rules jsonb, max_iterations numeric, collect text, queue text, priority numeric,
                    breaker_limit numeric, concurrency jsonb, rate_limit jsonb, map jsonb)) WITH ORDINALITY AS s
             CROSS JOIN LATERAL (
                    SELECT CASE WHEN s.retry ->> 'policy' IS NOT NULL
                                THEN (SELECT to_jsonb(p) FROM stepready.retry_policies p
                                       WHERE p.name = s.retry ->> 'policy') END AS sp,
                           COALESCE(s.concurrency, t.concurrency) AS fc, COALESCE(s.rate_limit, t.rate_limit) AS fr
                    OFFSET 0) f
        ), ins_edges AS (
            -- The parent of a dependency is found by name among its task's steps.
            INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
            SELECT v_sids[t.off + (nm.names ->> dep.name)::int], v_sids[t.off + s.ordinality]
              FROM t
             CROSS JOIN LATERAL (SELECT jsonb_object_agg(y.name, y.ordinality) AS names
                                   FROM ROWS FROM (jsonb_to_recordset(t.steps) AS (name text)) WITH ORDINALITY AS y)
                   nm
             CROSS JOIN LATERAL ROWS FROM (jsonb_to_recordset(t.steps) AS (depends_on jsonb)) WITH ORDINALITY AS s
             CROSS JOIN LATERAL jsonb_array_elements_text(s.depends_on) AS dep(name)
        )
        SELECT (SELECT array_agg(i.id ORDER BY i.id) FROM ins_tasks i), count(*)
          INTO v_ins_ids, v_notified
          FROM t;
        -- Daemons are told (sql/045_notify.sql): every task created has a step with no
        -- parent, claimable now or at its run_at (which their wake-up timer must learn). One increment per call.
        IF v_notified > 0 THEN
            PERFORM stepready._notify_ready(NULL);
        END IF;

        -- Map steps (sql/058_map.sql): their `map` written apart, by a statement that only a call defining one
        -- runs (and PL/pgSQL only plans then): creation without a map costs one text search more, and works on
        -- a schema older than version 15 (the migrations' tests create tasks there).
        IF strpos(p_definitions::text, '"map"') > 0 AND v_ins_ids IS NOT NULL THEN
            UPDATE stepready.steps s
               SET map = m.map, updated_at = now()
              FROM (SELECT v_sids[u.off + x.o::int] AS id, x.st -> 'map' AS map
                      FROM unnest(v_new_ords, v_new_ids, v_offs) AS u(ord, tid, off)
                     CROSS JOIN LATERAL jsonb_array_elements(p_definitions -> (u.ord - 1) -> 'steps')
                           WITH ORDINALITY AS x(st, o)
                     WHERE x.st ? 'map' AND u.tid = ANY (v_ins_ids)) m
             WHERE s.id = m.id;
        END IF;

        -- Wait steps (sql/059_signals.sql), in the same way: their `wait`, then those without a parent start
        -- waiting at once (the others when their last parent is satisfied: sql/040_task_status.sql).
        IF strpos(p_definitions::text, '"wait"') > 0 AND v_ins_ids IS NOT NULL THEN
            WITH w AS (
                UPDATE stepready.steps s
                   SET wait = m.wait, updated_at = now()
                  FROM (SELECT v_sids[u.off + x.o::int] AS id, x.st -> 'wait' AS wait
                          FROM unnest(v_new_ords, v_new_ids, v_offs) AS u(ord, tid, off)
                         CROSS JOIN LATERAL jsonb_array_elements(p_definitions -> (u.ord - 1) -> 'steps')
                               WITH ORDINALITY AS x(st, o)
                         WHERE x.st ? 'wait' AND u.tid = ANY (v_ins_ids)) m
                 WHERE s.id = m.id
                RETURNING s.id, s.pending_parents
            )
            SELECT array_agg(w.id ORDER BY w.id) FILTER (WHERE w.pending_parents = 0) INTO v_waits FROM w;
            IF v_waits IS NOT NULL THEN
                PERFORM stepready._wait_enter(v_waits, now());
            END IF;
        END IF;

        IF cardinality(v_ins_ids) = cardinality(v_new_ids) THEN
            v_ords := v_new_ords;
            v_tids := v_new_ids;
        ELSIF v_ins_ids IS NOT NULL THEN
            SELECT array_agg(n.ord ORDER BY n.ord), array_agg(n.id ORDER BY n.ord) INTO v_ords, v_tids
              FROM unnest(v_new_ords, v_new_ids) AS n(ord, id)
             WHERE (SELECT jsonb_object_agg(i::text, true) FROM unnest(v_ins_ids) AS i) ? n.id::text;
        END IF;
    END IF;

    -- 5. One row per element, in input order.
    IF NOT v_keyed AND cardinality(v_ords) = jsonb_array_length(p_definitions) THEN
        RETURN QUERY SELECT g.o::int, v_tids[g.o], true FROM generate_series(1, cardinality(v_ords)) AS g(o);
        RETURN;
    END IF;
    -- Keys whose task was neither found in step 2 nor created here were taken by a concurrent creator that
    -- committed meanwhile.
    IF cardinality(v_new_ords) IS DISTINCT FROM cardinality(v_ords) THEN
        SELECT v_known || COALESCE(jsonb_object_agg(k.key, k.id) FILTER (WHERE k.id IS NOT NULL), '{}') INTO v_known
          FROM (SELECT u.key, (SELECT t.id FROM stepready.tasks t WHERE t.idempotency_key = u.key) AS id
                  FROM (SELECT DISTINCT p_definitions -> (n.ord - 1) ->> 'idempotency_key' AS key
                          FROM unnest(v_new_ords, v_new_ids) AS n(ord, id)
                         WHERE NOT n.id = ANY (COALESCE(v_ins_ids, '{}'))) u
                 WHERE u.key IS NOT NULL) k;
    END IF;
    RETURN QUERY
    WITH c AS (
        SELECT COALESCE(jsonb_object_agg(u.ord::text, u.id), '{}') AS by_ord,
               v_known || COALESCE(jsonb_object_agg(p_definitions -> (u.ord - 1) ->> 'idempotency_key', u.id)
                                       FILTER (WHERE p_definitions -> (u.ord - 1) ->> 'idempotency_key' IS NOT NULL),
                                   '{}') AS by_key
          FROM unnest(v_ords, v_tids) AS u(ord, id)
    )
    SELECT e.ord::int, COALESCE((c.by_ord ->> e.ord::text)::bigint, (c.by_key ->> (e.d ->> 'idempotency_key'))::bigint),
           c.by_ord ? e.ord::text
      FROM jsonb_array_elements(p_definitions) WITH ORDINALITY AS e(d, ord), c
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
-- (PL/pgSQL: as a LANGUAGE sql function it would be parsed and planned again at every call.)
CREATE OR REPLACE FUNCTION stepready.create_task(p_definition jsonb)
RETURNS bigint
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN (SELECT c.task_id FROM stepready._create_tasks(jsonb_build_array(p_definition), false) AS c);
END;
$$;

CREATE OR REPLACE FUNCTION stepready._task_templates_validate()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    BEGIN
        PERFORM stepready._validate_definitions(jsonb_build_array(
            NEW.definition || jsonb_build_object('name', COALESCE(NEW.definition ->> 'name', NEW.name))), false);
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
-- p_context replaces it), p_idempotency_key set when not NULL, and p_run_at, when not NULL, as its run_at (over the
-- template's own, if it has one: the caller's start time wins).
DROP FUNCTION IF EXISTS stepready._template_definition(jsonb, text, jsonb, text); -- before p_run_at
CREATE OR REPLACE FUNCTION stepready._template_definition(p_template jsonb, p_name text, p_context jsonb,
                                                         p_idempotency_key text, p_run_at timestamptz)
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
                   ELSE jsonb_build_object('idempotency_key', p_idempotency_key) END
           || CASE WHEN p_run_at IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('run_at', p_run_at) END;
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
-- p_run_at, when not NULL, is the task's run_at: no step of it starts before then (sql/120_run_at.sql).
DROP FUNCTION IF EXISTS stepready.create_task_from_template(text, jsonb, text); -- before p_run_at
CREATE OR REPLACE FUNCTION stepready.create_task_from_template(p_name text, p_context jsonb,
                                                               p_idempotency_key text DEFAULT NULL,
                                                               p_run_at timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT stepready.create_task(
        stepready._template_definition(stepready._template_newest(p_name), p_name, p_context, p_idempotency_key,
                                       p_run_at));
$$;

-- Creates one task per element of the JSON array p_contexts from the newest version of a template, as
-- create_tasks does (SPEC §12): one row per context in input order, all or nothing. p_idempotency_keys, when
-- given, pairs with the contexts by position (a NULL element means no key); its length must match. p_run_at, when
-- not NULL, is the run_at of every task it creates (a task an idempotency key finds is left as it is).
DROP FUNCTION IF EXISTS stepready.create_tasks_from_template(text, jsonb, text[]); -- before p_run_at
CREATE OR REPLACE FUNCTION stepready.create_tasks_from_template(p_name text, p_contexts jsonb,
                                                                p_idempotency_keys text[] DEFAULT NULL,
                                                                p_run_at timestamptz DEFAULT NULL)
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
                                                                        p_idempotency_keys[e.ord], p_run_at)
                                          ORDER BY e.ord),
                                '[]')
                  FROM jsonb_array_elements(p_contexts) WITH ORDINALITY AS e(ctx, ord))) AS c;
END;
$$;
