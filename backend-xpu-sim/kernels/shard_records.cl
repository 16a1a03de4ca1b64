// `shard_records` (docs/semantics.md §4d): not yet written for xpu-sim. The device reports
// `Capabilities::sharded = false`, so the front answers `Error::Unsupported` before any launch
// and no program of this file is built.
