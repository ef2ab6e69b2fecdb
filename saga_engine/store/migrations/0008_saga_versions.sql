-- 0008_saga_versions: versions of a saga type side by side, and their gradual rollout
-- (docs/operations.md, "Rolling out a new saga version").
--
-- sagas.saga_version: the version of its type a saga runs (its saga_started records it
-- too; this column serves the listing). A constant default only changes the catalogue
-- (no table rewrite) and every saga before this migration ran version 1. The engine
-- writes it only for a saga above version 1, in a statement of its own: creates of
-- version-1 sagas (every create, until a second version is deployed) cost what they did.
ALTER TABLE sagas ADD COLUMN saga_version integer NOT NULL DEFAULT 1;

-- The rollout of each saga type that has one: new starts whose bucket (a hash of the
-- saga id, 0-99) is below `percent`, or whose input the named `predicate` accepts, run
-- `version`; the others run the highest version below it. No row: the highest version
-- deployed. Every engine reads this table every engine.rollout_refresh_s.
CREATE TABLE saga_rollouts (
    saga_type   text PRIMARY KEY,
    version     integer NOT NULL CHECK (version >= 1),
    percent     integer NOT NULL CHECK (percent BETWEEN 0 AND 100),
    predicate   text,
    updated_at  timestamptz NOT NULL,
    updated_by  text NOT NULL
);

-- Every change of a rollout: who, when, why, before -> after (null: no row). Written in
-- the change's transaction; append-only (the trigger below refuses UPDATE and DELETE).
CREATE TABLE saga_rollout_audit (
    id          bigserial PRIMARY KEY,
    saga_type   text NOT NULL,
    at          timestamptz NOT NULL,
    principal   text NOT NULL,
    reason      text NOT NULL,
    before      jsonb,
    after       jsonb
);
CREATE INDEX saga_rollout_audit_type_idx ON saga_rollout_audit (saga_type, id DESC);

CREATE FUNCTION saga_rollout_audit_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'saga_rollout_audit is append-only';
END;
$$;
CREATE TRIGGER saga_rollout_audit_append_only
    BEFORE UPDATE OR DELETE ON saga_rollout_audit
    FOR EACH ROW EXECUTE FUNCTION saga_rollout_audit_append_only();
