// `shard_records` (docs/semantics.md §4d): not yet written for CUDA. The device reports
// `Capabilities::sharded = false`, so the front answers `Error::Unsupported` before any launch
// and no module of this file is built.
