-- draftscope history schema (DuckDB 2.x).
--
-- The file is split into numbered migrations and one views section. history.py applies every
-- migration newer than meta.schema_version, in order, in ONE transaction, then (re)creates the
-- views. A migration, once released, is never edited: change the schema by appending a new one.
-- Views are recreated whenever their text changes (meta.views_sha), so they may be edited freely.
-- All timestamps are UTC. Names follow the engine's records: drafted, accepted, bonus, p, q, tau...

-- migration 1: runs, steps, kflat
CREATE TABLE meta (
    key   VARCHAR PRIMARY KEY,
    value VARCHAR
);

CREATE TABLE runs (
    run_id             VARCHAR PRIMARY KEY,   -- uuidv7 text: sorts by creation time
    created_at         TIMESTAMP NOT NULL,
    status             VARCHAR NOT NULL CHECK (status IN ('done', 'cancelled')),
    source             VARCHAR,               -- 'app' | 'bench' | 'cli' | ...
    -- settings
    target             VARCHAR,
    target_path        VARCHAR,
    dtype              VARCHAR,
    drafter            VARCHAR,
    drafter_checkpoint VARCHAR,
    k                  INTEGER,
    temperature        DOUBLE,
    top_p              DOUBLE,
    seed               BIGINT,
    max_new_tokens     INTEGER,
    backend            VARCHAR,
    device_kind        VARCHAR,
    versions           VARCHAR,               -- JSON object text
    -- prompt
    prompt             VARCHAR,
    prompt_ids         INTEGER[],
    suite              VARCHAR,
    prompt_id          VARCHAR,
    category           VARCHAR,
    -- stats
    wall_s             DOUBLE,
    prefill_ms         DOUBLE,
    decode_s           DOUBLE,
    draft_ms           DOUBLE,
    verify_ms          DOUBLE,
    tau                DOUBLE,
    acceptance_rate    DOUBLE,
    tok_per_s          DOUBLE,
    n_steps            INTEGER,
    n_generated        INTEGER,
    n_prompt           INTEGER,
    drafted            INTEGER,
    accepted           INTEGER,
    compiles           INTEGER,
    stop_reason        VARCHAR,
    -- output
    text               VARCHAR,
    token_ids          INTEGER[],
    lossless           BOOLEAN,               -- NULL: not checked
    comparison_group   VARCHAR,
    extra              VARCHAR                -- JSON: {"stats": {}, "settings": {}, "meta": {}} keys unknown here
);

CREATE TABLE steps (
    run_id       VARCHAR NOT NULL,
    idx          INTEGER NOT NULL,            -- StepTrace.index
    position     INTEGER NOT NULL,            -- absolute position of the block's anchor token
    drafted      INTEGER[] NOT NULL,
    accepted     INTEGER NOT NULL,
    bonus        INTEGER,
    p            DOUBLE[],
    q            DOUBLE[],
    top5_ids     INTEGER[][],
    top5_p       DOUBLE[][],
    emitted      INTEGER[] NOT NULL,
    draft_ms     DOUBLE,
    verify_ms    DOUBLE,
    drafted_text VARCHAR[],
    bonus_text   VARCHAR,
    top5_text    VARCHAR[][],
    PRIMARY KEY (run_id, idx)
);

CREATE TABLE kflat (
    sweep_id   VARCHAR NOT NULL,
    created_at TIMESTAMP NOT NULL,
    hardware   VARCHAR NOT NULL,              -- e.g. 'cpu: AMD EPYC 2 cores', 'gpu: NVIDIA H200'
    backend    VARCHAR,
    model      VARCHAR,
    dtype      VARCHAR,
    context    INTEGER NOT NULL,
    k          INTEGER NOT NULL,
    verify_ms  DOUBLE,
    draft_ms   DOUBLE,
    drafter    VARCHAR,
    extra      VARCHAR                        -- JSON of any other row keys
);

-- migration 2: annotations and the editable label list
CREATE SEQUENCE annotation_id_seq START 1;

CREATE TABLE labels (
    name       VARCHAR PRIMARY KEY,
    created_at TIMESTAMP NOT NULL
);

INSERT INTO labels VALUES
    ('format/whitespace', TIMESTAMP '2000-01-01 00:00:01'),
    ('number',            TIMESTAMP '2000-01-01 00:00:02'),
    ('code-syntax',       TIMESTAMP '2000-01-01 00:00:03'),
    ('paraphrase',        TIMESTAMP '2000-01-01 00:00:04'),
    ('long-range',        TIMESTAMP '2000-01-01 00:00:05'),
    ('other',             TIMESTAMP '2000-01-01 00:00:06');

CREATE TABLE annotations (
    annotation_id BIGINT PRIMARY KEY DEFAULT nextval('annotation_id_seq'),
    run_id        VARCHAR NOT NULL,
    step_idx      INTEGER NOT NULL,           -- steps.idx
    draft_pos     INTEGER NOT NULL,           -- 0-based index into steps.drafted
    label         VARCHAR NOT NULL,
    note          VARCHAR NOT NULL DEFAULT '',
    created_at    TIMESTAMP NOT NULL,
    updated_at    TIMESTAMP NOT NULL
);

-- migration 3: batch size and device mesh of a run (every earlier run was one sequence on one device)
ALTER TABLE runs ADD COLUMN batch INTEGER DEFAULT 1;   -- sequences verified together in that generation
ALTER TABLE runs ADD COLUMN mesh VARCHAR DEFAULT '1x1'; -- device mesh data x model

-- migration 4: one annotation per drafted token; of duplicates the last edited one is kept
ALTER TABLE annotations RENAME TO annotations_v3;

CREATE TABLE annotations (
    annotation_id BIGINT PRIMARY KEY DEFAULT nextval('annotation_id_seq'),
    run_id        VARCHAR NOT NULL,
    step_idx      INTEGER NOT NULL,           -- steps.idx
    draft_pos     INTEGER NOT NULL,           -- 0-based index into steps.drafted
    label         VARCHAR NOT NULL,
    note          VARCHAR NOT NULL DEFAULT '',
    created_at    TIMESTAMP NOT NULL,
    updated_at    TIMESTAMP NOT NULL,
    UNIQUE (run_id, step_idx, draft_pos)
);

INSERT INTO annotations
SELECT * FROM annotations_v3
QUALIFY row_number() OVER (PARTITION BY run_id, step_idx, draft_pos ORDER BY updated_at DESC, annotation_id DESC) = 1;

DROP TABLE annotations_v3;

-- migration 5: drafter doctor reports (experiments/doctor.py): one row per report, one per check variant
CREATE TABLE doctor_reports (
    report_id    VARCHAR PRIMARY KEY,         -- uuidv7 text
    created_at   TIMESTAMP NOT NULL,
    target       VARCHAR,
    target_path  VARCHAR,
    drafter      VARCHAR,
    drafter_path VARCHAR,
    faults       VARCHAR[] NOT NULL,          -- checks whose verdict is fault
    wall_s       DOUBLE,
    identity     VARCHAR NOT NULL,            -- JSON: paths, config hashes, versions, device
    settings     VARCHAR NOT NULL             -- JSON: prompts, max_new_tokens, raw, temperature, k, seed
);

CREATE TABLE doctor_checks (
    report_id    VARCHAR NOT NULL,
    idx          INTEGER NOT NULL,            -- row order within the report
    check_name   VARCHAR NOT NULL,            -- chat_template, thinking, taps, mask_token, shared_head, ...
    variant      VARCHAR NOT NULL,
    configured   BOOLEAN NOT NULL,            -- the pair as configured (carries the check's verdict)
    tau          DOUBLE,                      -- the verdict's metric (tau_est at every anchor); NULL: not measured
    engine_tau   DOUBLE,                      -- the engine's own tau of the same run, when there is one
    per_position DOUBLE[] NOT NULL,           -- P(accepted >= i), i = 1..K
    per_prompt   DOUBLE[] NOT NULL,           -- tau per prompt
    diff         DOUBLE,                      -- mean per-prompt tau difference against the configured pair
    margin       DOUBLE,                      -- its 95 % noise margin
    verdict      VARCHAR NOT NULL CHECK (verdict IN ('ok', 'fault', 'inconclusive')),
    detail       VARCHAR NOT NULL DEFAULT '',
    PRIMARY KEY (report_id, idx)
);

-- migration 6: how many verified block positions each step's recurrent state rolled back (hybrid targets)
ALTER TABLE steps ADD COLUMN state_rollback INTEGER DEFAULT 0;  -- StepTrace.state_rollback; 0 without recurrent layers

-- migration 7: the suite slice of a run's prompt, and the ar run its speedup was measured against
ALTER TABLE runs ADD COLUMN split VARCHAR;            -- 'dev' | 'test' of a named suite (experiments.suites); NULL: none
ALTER TABLE runs ADD COLUMN baseline_run_id VARCHAR;  -- the ar run of the same prompt and settings its speedup used

-- migration 8: doctor verdicts a user can act on: 'unresolved' (a large gain inside the noise margin), 'info'
-- (an expected difference, e.g. sampling) and 'not applicable' beside ok / fault / inconclusive
CREATE TABLE doctor_checks_v8 (
    report_id    VARCHAR NOT NULL,
    idx          INTEGER NOT NULL,
    check_name   VARCHAR NOT NULL,
    variant      VARCHAR NOT NULL,
    configured   BOOLEAN NOT NULL,
    tau          DOUBLE,
    engine_tau   DOUBLE,
    per_position DOUBLE[] NOT NULL,
    per_prompt   DOUBLE[] NOT NULL,
    diff         DOUBLE,
    margin       DOUBLE,
    verdict      VARCHAR NOT NULL CHECK (verdict IN ('ok', 'fault', 'unresolved', 'info', 'not applicable',
                                                     'inconclusive')),
    detail       VARCHAR NOT NULL DEFAULT '',
    PRIMARY KEY (report_id, idx)
);
INSERT INTO doctor_checks_v8 SELECT report_id, idx, check_name, variant, configured, tau, engine_tau, per_position,
    per_prompt, diff, margin,
    CASE WHEN verdict = 'inconclusive' AND detail LIKE 'not applicable:%' THEN 'not applicable' ELSE verdict END,
    detail FROM doctor_checks;
DROP TABLE doctor_checks;
ALTER TABLE doctor_checks_v8 RENAME TO doctor_checks;

-- views
-- One row per run: the columns a run list shows, plus its number of annotations.
CREATE OR REPLACE VIEW run_summary AS
SELECT r.run_id, r.created_at, r.status, r.source, r.suite, r.split, r.prompt_id, r.category,
       r.target, r.dtype, r.drafter, r.k, r.temperature, r.top_p, r.seed, r.backend, r.device_kind, r.batch, r.mesh,
       r.n_steps, r.n_generated, r.drafted, r.accepted, r.tau, r.acceptance_rate, r.tok_per_s,
       r.wall_s, r.prefill_ms, r.decode_s, r.stop_reason, r.lossless, r.comparison_group, r.baseline_run_id,
       left(r.prompt, 80) AS prompt_preview,
       coalesce(a.n_annotations, 0) AS n_annotations
FROM runs r
LEFT JOIN (SELECT run_id, count(*) AS n_annotations FROM annotations GROUP BY run_id) a USING (run_id);

-- Finished runs ('done'), each with is_repeat: true for every older copy of a run that repeats a newer one exactly
-- (same target, drafter checkpoint, K, sampling settings and seed, suite, batch, chat template, prompt and output
-- tokens). A deterministic run repeated gives the same steps again: the acceptance views count it once (its steps
-- are one sample, not several); timings count every copy (each is a timing sample of its own).
CREATE OR REPLACE VIEW finished_runs AS
SELECT *, row_number() OVER (
           PARTITION BY target, dtype, drafter, drafter_checkpoint, k, temperature, top_p, seed, suite, split, batch,
                        max_new_tokens, coalesce(json_extract_string(extra, '$.settings.template'), ''),
                        coalesce(json_extract(extra, '$.settings.raw')::BOOLEAN, false), prompt, token_ids
           ORDER BY created_at DESC, run_id DESC) > 1 AS is_repeat
FROM runs
WHERE status = 'done';

-- Per draft position i (1-based within the block, up to the run's K): how far blocks survive (finished runs, each
-- repeat counted once); one row set per drafter checkpoint (two checkpoints of one drafter kind are kept apart, as in every
-- view). Every step counts at every position, also a step that drafted fewer than i tokens (an n-gram miss drafts
-- none): it did not survive to i. n_steps: all steps; n_reached: steps with accepted >= i-1; n_accepted: steps with
-- accepted >= i. survival = n_accepted / n_steps never rises with i, and 1 + sum of survival is the steps' mean
-- tokens per step; conditional_acceptance = n_accepted / n_reached = P(accept i | accepted i-1).
CREATE OR REPLACE VIEW position_acceptance AS
WITH per_pos AS (
    SELECT r.target, r.drafter, r.drafter_checkpoint, r.suite, r.split, r.k, r.temperature, s.accepted,
           unnest(range(1, greatest(r.k, len(s.drafted)) + 1)) AS i
    FROM steps s JOIN finished_runs r USING (run_id)
    WHERE NOT r.is_repeat
)
SELECT target, drafter, drafter_checkpoint, suite, split, k, temperature, i,
       count(*) AS n_steps,
       count(*) FILTER (WHERE accepted >= i - 1) AS n_reached,
       count(*) FILTER (WHERE accepted >= i) AS n_accepted,
       count(*) FILTER (WHERE accepted >= i) / count(*) AS survival,
       count(*) FILTER (WHERE accepted >= i) / nullif(count(*) FILTER (WHERE accepted >= i - 1), 0)
           AS conditional_acceptance
FROM per_pos
GROUP BY target, drafter, drafter_checkpoint, suite, split, k, temperature, i;

-- Finished runs ('done') compared per target, suite (and slice), drafter (and checkpoint), k, temperature and batch size.
-- n_runs, tau, tau_std, acceptance_rate and n_generated: over distinct runs (a repeat counted once, finished_runs);
-- tau: mean over them; acceptance_rate: pooled sum(accepted) / sum(drafted); tok_per_s: mean over every run timed
-- without XLA compilation, repeats included (in a batch, one sequence's rate), n_timed of them.
CREATE OR REPLACE VIEW drafter_comparison AS
SELECT target, dtype, suite, split, drafter, drafter_checkpoint, k, temperature, batch,
       count(*) FILTER (WHERE NOT is_repeat) AS n_runs,
       avg(tau) FILTER (WHERE NOT is_repeat) AS tau,
       stddev_samp(tau) FILTER (WHERE NOT is_repeat) AS tau_std,
       sum(accepted) FILTER (WHERE NOT is_repeat) / nullif(sum(drafted) FILTER (WHERE NOT is_repeat), 0)
           AS acceptance_rate,
       avg(tok_per_s) FILTER (WHERE coalesce(compiles, 0) = 0) AS tok_per_s,
       count(*) FILTER (WHERE coalesce(compiles, 0) = 0) AS n_timed,
       sum(n_generated) FILTER (WHERE NOT is_repeat) AS n_generated
FROM finished_runs
GROUP BY target, dtype, suite, split, drafter, drafter_checkpoint, k, temperature, batch;

-- Histogram of accepted lengths per step (accepted = 0..len(drafted)), each repeat counted once.
CREATE OR REPLACE VIEW acceptance_lengths AS
SELECT r.target, r.drafter, r.drafter_checkpoint, r.suite, r.k, r.temperature, s.accepted, count(*) AS n_steps
FROM steps s JOIN finished_runs r USING (run_id)
WHERE NOT r.is_repeat
GROUP BY r.target, r.drafter, r.drafter_checkpoint, r.suite, r.k, r.temperature, s.accepted;

-- Speedup over ar measured like for like: each finished drafter run paired with the ar run of the same
-- comparison group on the same prompt, settings and machine; the drafter's decode tokens per second over ar's
-- (summed tokens / summed decode seconds on each side, prefill excluded), so outputs of different lengths (T > 0,
-- an early EOS) compare rates, not durations. Feeds the app's default drafter and K.
CREATE OR REPLACE VIEW measured_speedup AS
SELECT d.target, d.dtype, d.device_kind, d.batch, d.temperature, d.drafter, d.drafter_checkpoint, d.k,
       coalesce(json_extract_string(d.extra, '$.settings.template'), '') AS template,
       count(*) AS n_pairs,
       (sum(d.n_generated) / nullif(sum(d.decode_s), 0))
           / nullif(sum(a.n_generated) / nullif(sum(a.decode_s), 0), 0) AS speedup,
       avg(d.tau) AS tau
FROM runs d
JOIN runs a ON a.comparison_group = d.comparison_group AND a.drafter = 'ar' AND a.status = 'done'
           AND a.prompt = d.prompt AND a.max_new_tokens = d.max_new_tokens AND a.temperature = d.temperature
           AND a.batch = d.batch AND a.device_kind = d.device_kind AND a.target = d.target AND a.dtype = d.dtype
           AND coalesce(json_extract_string(a.extra, '$.settings.template'), '')
             = coalesce(json_extract_string(d.extra, '$.settings.template'), '')
WHERE d.status = 'done' AND d.drafter <> 'ar' AND d.comparison_group IS NOT NULL
GROUP BY ALL;
