-- 0017_flow_policies: insights split by flow policy (saga_insights, 0014).
--
-- A saga records the flow policy it was started under (saga_started.flow_policy, left
-- out of the stored event when it is 1). The roll-up now adds each run to rows of its
-- policy, so an operator compares a policy rolled out to a share of sagas with the
-- others before giving it every saga: the column joins the primary key, and a read of
-- a window sums over every policy unless it asks for one. The rows from before were all
-- policy 1 (no other existed): the default says so, a column with a constant default (no
-- rewrite of the table). The primary key is rebuilt with the column last, so a window's
-- read still walks (saga_type, bucket); rebuilding it locks the table for as long as
-- its index takes to build (the aggregates: tens of rows per type per five minutes, however many runs).
-- An engine of an older release fails its roll-ups and its insights reads after this
-- (its upsert names the old key): the runs stay waiting in saga_insights_pending, none
-- lost or counted twice, until an upgraded engine adds them.
ALTER TABLE saga_insights ADD COLUMN flow_policy integer NOT NULL DEFAULT 1;
ALTER TABLE saga_insights
    DROP CONSTRAINT saga_insights_pkey,
    ADD PRIMARY KEY (saga_type, bucket, facet, key, detail, flow_policy);
