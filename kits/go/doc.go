// Package kit is a participant kit for saga-engine, written from the wire
// protocol alone (proto/PROTOCOL.md, version 1).
//
// A participant consumes the commands of {prefix}.cmd.{name}, applies each
// command id at most once in a Postgres transaction, stores its reply in the
// same transaction together with a reply-outbox row, publishes the reply to the
// command's ce_replyto topic and only then commits the command's offset
// (PROTOCOL.md section 7.2). Records that can never be processed go to
// {prefix}.dlq with the dlq_* headers of section 11.
//
//	k, err := kit.New(kit.Config{Name: "inventory", Brokers: []string{"localhost:9092"}, DSN: dsn})
//	k.Handle("ReserveStock", func(ctx context.Context, tx pgx.Tx, cmd kit.Command) (any, error) {
//		var body struct{ SKU string `json:"sku"` }
//		if err := cmd.Decode(&body); err != nil {
//			return nil, err
//		}
//		// ... business change through tx ...
//		return map[string]any{"reservation_id": "r-1"}, nil
//	}, kit.WithBody[ReserveStock]())
//	err = k.Run(ctx) // returns once ctx is cancelled and the batch in hand is done
//
// A handler's effects are writes through tx by default: its command is then
// claimed by the insert of its outcome at the end of the transaction, and a
// copy may run the handler in a transaction that is rolled back. Register a
// handler that also acts outside tx (an HTTP call, a message) with
// kit.WithEffects(kit.EffectsOutside): its command is claimed before it runs.
//
// Session timeout: the kit uses 6 s by default (Config.SessionTimeout). Size
// your steps' per-attempt timeouts above three times that (section 7.6).
package kit
