//! The kernels of sharded rows (`docs/semantics.md` §4d, §5.13–§5.17) on the host emulator,
//! against the reference device: slices of ordinary and hostile logits rows (every kind of
//! temperature) and of probability rows, in every float dtype, a wide slice read four at a time
//! and a slice of one token; each op with its options (ids, both key orders, `K` below and above
//! the slice, min_p, prefixes and floors, thresholds and offsets, REJECTION's residual against
//! draft rows, some of them none), bit for bit (`shard_exp_sum` within the float tolerance).

use specula_backend_api::shard::KeyOrder;

use super::*;

/// The whole rows' vocabulary.
const VOCAB: usize = 700;
/// Rows per case (one emulated block each).
const ROWS: usize = 6;
/// `(first, len)` of the slices: a wide one (read four at a time) and the last token alone.
const SLICES: [(usize, usize); 2] = [(200, 300), (699, 1)];
/// Draft rows of the residual cases.
const DRAFT_ROWS: usize = 3;

/// Whole rows of one case on the reference device, with what the ops take besides the scores.
struct WholeRows {
    dtype: DType,
    logits: bool,
    /// `[rows, VOCAB]` f32 values (converted to `dtype` when uploaded).
    values: Vec<f32>,
    rows: usize,
    temperature: Vec<f32>,
    min_p: Vec<f32>,
}

impl WholeRows {
    fn new(rng: &mut Rng, dtype: DType, logits: bool, rows_n: usize, shift: usize) -> Self {
        let values = if logits {
            kinded_logit_rows(rng, rows_n, VOCAB)
        } else {
            kinded_prob_rows(rng, rows_n, VOCAB)
        };
        let min_p = [0.0, 0.05, f32::NAN, 0.3, 1.5, -1.0];
        WholeRows {
            dtype,
            logits,
            values,
            rows: rows_n,
            temperature: temperature_kinds(rows_n, shift),
            min_p: (0..rows_n)
                .map(|r| min_p[(r + shift) % min_p.len()])
                .collect(),
        }
    }

    /// The `[rows, len]` slice `[first, first + len)` of every row, in the rows' dtype.
    fn cut(&self, (first, len): (usize, usize)) -> Vec<u8> {
        let values: Vec<f32> = (0..self.rows)
            .flat_map(|r| self.values[r * VOCAB + first..r * VOCAB + first + len].to_vec())
            .collect();
        score_bytes(&values, self.dtype)
    }

    /// The rows' scores on `dev` (logits with their temperatures), for `shape`'s slice.
    fn scores<'a>(&self, buffers: &'a (Buffer, Buffer)) -> Scores<'a> {
        if self.logits {
            Scores::logits(&buffers.0, &buffers.1)
        } else {
            Scores::Probs(&buffers.0)
        }
    }

    /// The slice's scores and the temperatures on `dev`.
    fn upload(&self, dev: &dyn Device, slice: (usize, usize)) -> (Buffer, Buffer) {
        let scores = dev
            .upload_bytes(self.dtype, &self.cut(slice))
            .expect("upload");
        (scores, up(dev, &self.temperature))
    }

    /// Each whole row's row key: the largest key of the whole row in rank order.
    fn row_keys(&self, dev: &dyn Device) -> Vec<u64> {
        let buffers = self.upload(dev, (0, VOCAB));
        let keys = key_on(
            dev,
            self.scores(&buffers),
            None,
            self.shape((0, VOCAB)),
            KeyOrder::Rank,
        );
        down::<u64>(dev, &keys)
    }

    fn shape(&self, (first, len): (usize, usize)) -> ShardShape {
        ShardShape {
            rows: self.rows,
            slice: VocabSlice {
                first,
                len,
                vocab: VOCAB,
            },
        }
    }

    /// Writes the slice's inputs of every sharded kernel: scores, temperature, row_key, min_p.
    fn write(&self, work: &Workdir, slice: (usize, usize), row_keys: &[u64]) {
        work.write("scores.bin", &self.cut(slice));
        work.write("temperature.bin", &self.temperature);
        work.write("row_key.bin", row_keys);
        work.write("min_p.bin", &self.min_p);
    }
}

/// `shard_key` on `dev`.
fn key_on(
    dev: &dyn Device,
    scores: Scores<'_>,
    ids: Option<&Buffer>,
    shape: ShardShape,
    order: KeyOrder,
) -> Buffer {
    let mut keys = dev.alloc::<u64>(shape.rows).expect("alloc");
    let inputs = ShardKeyInputs::new(scores).with_ids(ids);
    dev.shard_key(&inputs, &mut keys, &ShardKeyParams { shape, order })
        .expect("shard_key");
    keys
}

/// The kernels' code of a key order (`shard.cuh`).
fn order_code(order: KeyOrder) -> u32 {
    match order {
        KeyOrder::Rank => 0,
        KeyOrder::Argmax => 1,
    }
}

/// A sum of `shard_exp_sum` within the float tolerance (`softmax_tolerance`: the ranks' sums
/// add up to at least 1).
fn sum_close(got: f32, want: f32) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got.is_infinite() || want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= 1e-6f32.max(1e-4 * got.abs().max(want.abs()))
}

/// One case: whole rows, a slice of them, and what every op of the slice is compared on.
struct SliceCase<'a> {
    work: &'a Workdir,
    bin: &'a Path,
    dev: &'a ReferenceDevice,
    whole: &'a WholeRows,
    slice: (usize, usize),
    row_keys: &'a [u64],
    label: String,
}

impl SliceCase<'_> {
    fn expect(&self, what: &str) -> Expect<'_> {
        Expect::new(self.work, self.dev, format!("{} {what}", self.label))
    }

    fn buffers(&self) -> (Buffer, Buffer) {
        self.whole.upload(self.dev, self.slice)
    }

    /// The reference's rows: the slice's scores, the row keys, min_p when `with_min_p`.
    fn rows_on<'b>(
        &self,
        buffers: &'b (Buffer, Buffer),
        keys_and_min_p: &'b (Buffer, Buffer),
        with_min_p: bool,
    ) -> ShardRows<'b> {
        ShardRows::new(self.whole.scores(buffers), &keys_and_min_p.0)
            .with_min_p(with_min_p.then_some(&keys_and_min_p.1))
    }

    fn keys_and_min_p(&self) -> (Buffer, Buffer) {
        (up(self.dev, self.row_keys), up(self.dev, &self.whole.min_p))
    }

    fn common_args(&self) -> [u64; 3] {
        [
            self.whole.rows as u64,
            self.slice.1 as u64,
            self.slice.0 as u64,
        ]
    }

    fn key(&self, rng: &mut Rng) {
        let ids: Vec<i32> = (0..self.whole.rows)
            .map(|r| match r % 3 {
                0 => (self.slice.0 + (rng.next_u64() as usize) % self.slice.1) as i32,
                1 => (rng.next_u64() % (VOCAB as u64 + 3)) as i32 - 1,
                _ => rng.next_u64() as i32,
            })
            .collect();
        self.work.write("ids.bin", &ids);
        let buffers = self.buffers();
        let ids_buffer = up(self.dev, &ids);
        let [rows, len, first] = self.common_args();
        for order in KeyOrder::ALL {
            for with_ids in [false, true] {
                let code = order_code(order);
                let logits = u32::from(self.whole.logits);
                let flag = u32::from(with_ids);
                self.work.run(
                    self.bin,
                    "shard_key",
                    &[&rows, &len, &first, &code, &logits, &flag],
                );
                let ids = with_ids.then_some(&ids_buffer);
                let want = key_on(
                    self.dev,
                    self.whole.scores(&buffers),
                    ids,
                    self.whole.shape(self.slice),
                    order,
                );
                let what = format!("shard_key {order:?} ids {with_ids}");
                self.expect(&what).same::<u64>("keys.out", &want, "keys");
            }
        }
    }

    fn records(&self) {
        let buffers = self.buffers();
        let extra = self.keys_and_min_p();
        let [rows, len, first] = self.common_args();
        let cases = [
            (1usize, KeyOrder::Rank, false),
            (7, KeyOrder::Argmax, true),
            (self.slice.1, KeyOrder::Rank, true),
            (1024, KeyOrder::Argmax, false),
        ];
        for (k, order, with_min_p) in cases {
            let (code, logits) = (order_code(order), u32::from(self.whole.logits));
            let min_p = u32::from(with_min_p);
            self.work.run(
                self.bin,
                "shard_records",
                &[&rows, &len, &first, &k, &code, &logits, &min_p],
            );
            let mut want = self
                .dev
                .alloc::<u64>(self.whole.rows * k * 2)
                .expect("alloc");
            let params = ShardRecordsParams {
                shape: self.whole.shape(self.slice),
                records: k,
                order,
            };
            let inputs = self.rows_on(&buffers, &extra, with_min_p);
            self.dev
                .shard_records(&inputs, &mut want, &params)
                .expect("shard_records");
            let what = format!("shard_records K={k} {order:?} min_p {with_min_p}");
            self.expect(&what)
                .same::<u64>("records.out", &want, "records");
        }
    }

    fn histogram(&self) {
        let buffers = self.buffers();
        let extra = self.keys_and_min_p();
        let [rows, len, first] = self.common_args();
        let keys = self.row_keys;
        // The first round (every key), a middle round within the row key's prefix above a floor,
        // and the last round.
        let rounds: [(u32, Vec<u64>, Vec<u64>, bool); 3] = [
            (44, vec![0; keys.len()], vec![0; keys.len()], false),
            (
                20,
                keys.iter().map(|k| k >> 28).collect(),
                keys.iter().map(|k| k >> 1).collect(),
                true,
            ),
            (
                0,
                keys.iter().map(|k| k >> 8).collect(),
                vec![0; keys.len()],
                true,
            ),
        ];
        for (shift, prefix, floor, with_min_p) in rounds {
            self.work.write("prefix.bin", &prefix);
            self.work.write("floor.bin", &floor);
            let (logits, min_p) = (u32::from(self.whole.logits), u32::from(with_min_p));
            self.work.run(
                self.bin,
                "shard_histogram",
                &[&rows, &len, &first, &shift, &logits, &min_p],
            );
            let n = self.whole.rows * 256;
            let mut counts = self.dev.alloc::<u64>(n).expect("alloc");
            let mut masses = self.dev.alloc::<u64>(n).expect("alloc");
            let (prefix, floor) = (up(self.dev, &prefix), up(self.dev, &floor));
            let inputs = ShardHistogramInputs {
                rows: self.rows_on(&buffers, &extra, with_min_p),
                prefix: &prefix,
                floor: &floor,
            };
            let mut out = ShardHistogramOutputs {
                counts: &mut counts,
                masses: &mut masses,
            };
            let params = ShardHistogramParams {
                shape: self.whole.shape(self.slice),
                shift,
            };
            self.dev
                .shard_histogram(&inputs, &mut out, &params)
                .expect("shard_histogram");
            let expect = self.expect(&format!("shard_histogram shift {shift}"));
            expect.same::<u64>("counts.out", &counts, "counts");
            expect.same::<u64>("masses.out", &masses, "masses");
        }
    }

    fn walk(&self, rng: &mut Rng, draft: &WholeRows) {
        let buffers = self.buffers();
        let extra = self.keys_and_min_p();
        let [rows, len, first] = self.common_args();
        let n = self.whole.rows;
        let threshold: Vec<u64> = (0..n)
            .map(|r| match r % 4 {
                0 => 0,
                1 => self.row_keys[r] >> 1,
                2 => self.row_keys[r],
                _ => rng.next_u64() >> (rng.next_u64() % 64),
            })
            .collect();
        let offset: Vec<u64> = (0..n)
            .map(|r| match r % 4 {
                0 => u64::MAX,
                1 => 0,
                2 => 1 << 39,
                _ => rng.next_u64() >> (rng.next_u64() % 64),
            })
            .collect();
        self.work.write("threshold.bin", &threshold);
        self.work.write("offset.bin", &offset);
        // The residual against draft rows: their slice, their row keys, a draft row per row
        // (some none), and masses from realistic to garbage.
        let draft_keys = draft.row_keys(self.dev);
        let draft_row: Vec<i32> = (0..n as i32)
            .map(|r| [0, 1, 2, -1, 3, 1][r as usize % 6])
            .collect();
        let target_mass: Vec<u64> = (0..n)
            .map(|r| [1 << 40, 3 << 40, 1, 0, 1 << 59, rng.next_u64()][r % 6])
            .collect();
        let draft_mass: Vec<u64> = (0..n)
            .map(|r| [1 << 41, 1 << 40, rng.next_u64(), 5, 1, 1 << 63][r % 6])
            .collect();
        self.work.write("draft.bin", &draft.cut(self.slice));
        self.work.write("draft_key.bin", &draft_keys);
        self.work.write("draft_row.bin", &draft_row);
        self.work.write("target_mass.bin", &target_mass);
        self.work.write("draft_mass.bin", &draft_mass);
        let (threshold, offset) = (up(self.dev, &threshold), up(self.dev, &offset));
        let draft_buffers = draft.upload(self.dev, self.slice);
        let residual_buffers = [
            up(self.dev, &draft_keys),
            up(self.dev, &draft_row),
            up(self.dev, &target_mass),
            up(self.dev, &draft_mass),
        ];
        for (with_residual, with_min_p) in [(false, true), (true, false), (true, true)] {
            let logits = u32::from(self.whole.logits);
            let (min_p, drafts) = (
                u32::from(with_min_p),
                if with_residual { DRAFT_ROWS } else { 0 },
            );
            self.work.run(
                self.bin,
                "shard_walk",
                &[&rows, &len, &first, &logits, &min_p, &drafts],
            );
            let [draft_key, draft_row, target_mass, draft_mass] = &residual_buffers;
            let residual = with_residual.then_some(ShardResidual {
                draft: &draft_buffers.0,
                draft_key,
                draft_row,
                target_mass,
                draft_mass,
            });
            let inputs = ShardWalkInputs {
                rows: self.rows_on(&buffers, &extra, with_min_p),
                threshold: &threshold,
                offset: &offset,
                residual,
            };
            let mut tokens = self.dev.alloc::<i32>(n).expect("alloc");
            let mut mass = self.dev.alloc::<u64>(n).expect("alloc");
            let mut count = self.dev.alloc::<u64>(n).expect("alloc");
            let mut out = ShardWalkOutputs {
                tokens: &mut tokens,
                mass: &mut mass,
                count: &mut count,
            };
            let params = ShardWalkParams {
                shape: self.whole.shape(self.slice),
            };
            self.dev
                .shard_walk(&inputs, &mut out, &params)
                .expect("shard_walk");
            let what = format!("shard_walk residual {with_residual} min_p {with_min_p}");
            let expect = self.expect(&what);
            expect.same::<i32>("tokens.out", &tokens, "tokens");
            expect.same::<u64>("mass.out", &mass, "mass");
            expect.same::<u64>("count.out", &count, "count");
        }
    }

    fn exp_sum(&self) {
        let buffers = self.buffers();
        let row_key = up(self.dev, self.row_keys);
        let [rows, len, first] = self.common_args();
        self.work
            .run(self.bin, "shard_exp_sum", &[&rows, &len, &first]);
        let mut sums = self.dev.alloc::<f32>(self.whole.rows).expect("alloc");
        let inputs = ShardExpSumInputs {
            logits: &buffers.0,
            temperature: &buffers.1,
            row_key: &row_key,
        };
        let params = ShardExpSumParams {
            shape: self.whole.shape(self.slice),
        };
        self.dev
            .shard_exp_sum(&inputs, &mut sums, &params)
            .expect("shard_exp_sum");
        self.expect("shard_exp_sum")
            .close("sums.out", &sums, "sums", sum_close);
    }
}

pub(super) fn sharded_row_kernels_match_the_reference() {
    let work = Workdir::new("sharded");
    let dev = ReferenceDevice::new();
    let mut rng = Rng(0x5A_4D_ED);
    for (i, dtype) in DType::FLOATS.into_iter().enumerate() {
        let bin = driver(dtype);
        for logits in [true, false] {
            let whole = WholeRows::new(&mut rng, dtype, logits, ROWS, i);
            let draft = WholeRows::new(&mut rng, dtype, logits, DRAFT_ROWS, i + 1);
            let row_keys = whole.row_keys(&dev);
            for slice in SLICES {
                whole.write(&work, slice, &row_keys);
                let case = SliceCase {
                    work: &work,
                    bin: &bin,
                    dev: &dev,
                    whole: &whole,
                    slice,
                    row_keys: &row_keys,
                    label: format!("{dtype} logits {logits} slice {slice:?}"),
                };
                case.key(&mut rng);
                case.records();
                case.histogram();
                case.walk(&mut rng, &draft);
                if logits {
                    case.exp_sum();
                }
            }
        }
    }
}
