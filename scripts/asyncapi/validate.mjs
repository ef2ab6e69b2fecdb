// Validates an AsyncAPI document with @asyncapi/parser; prints its diagnostics as JSON
// ({"errors": [...], "warnings": [...]}) and exits 1 if any is an error.
import { readFileSync } from "node:fs";
import { Parser } from "@asyncapi/parser";

const path = process.argv[2];
const parser = new Parser();
const { document, diagnostics } = await parser.parse(readFileSync(path, "utf8"), { source: path });
const pick = (severity) =>
  diagnostics
    .filter((d) => d.severity === severity)
    .map((d) => ({ code: d.code, message: d.message, path: d.path.join("/") }));
const result = { errors: pick(0), warnings: pick(1), parsed: document !== undefined };
console.log(JSON.stringify(result));
process.exit(result.errors.length || !result.parsed ? 1 : 0);
