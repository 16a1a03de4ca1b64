// `shard_key` (docs/semantics.md §4d): not yet written for wgpu. The device reports
// `Capabilities::sharded = false`, so the front answers `Error::Unsupported` before any launch
// and no pipeline of this module is built.
