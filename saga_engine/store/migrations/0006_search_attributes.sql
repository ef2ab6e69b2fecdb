-- 0006_search_attributes: business keys a saga type declares (`search_attributes`), so
-- operators find a saga by, say, its order id: `GET /sagas?order_id=o-42`.
--
-- One jsonb object per saga ({"order_id": "o-42"}), written with the saga's row when
-- it is created (no extra statement on the hot path), null for types that declare none.
-- ADD COLUMN without a default only changes the catalogue, but it still takes ACCESS
-- EXCLUSIVE on sagas for that instant; the index build then holds SHARE (writes wait,
-- reads go on) while it reads the table: run it when the engines are quiet.
ALTER TABLE sagas ADD COLUMN search jsonb;

-- "search @> '{"order_id": "o-42"}'" is answered from this index (jsonb_path_ops: the
-- containment operator only, and a smaller index than the default operator class).
CREATE INDEX sagas_search_idx ON sagas USING gin (search jsonb_path_ops)
    WHERE search IS NOT NULL;
