// argmax (§5.4): one cluster per row (cluster-stride), each core the argmax of its slice
// on integer order keys (NaN lowest, -0 == +0), core 0 merges in core order so ties keep the
// lowest id.

// struct ArgmaxArgs: generated from src/ops/argmax.rs.

__kernel void ENTRY(BUF(const T_STORE, input), BUF(int, out), const struct ArgmaxArgs args) {
    BIND(const T_STORE, input);
    BIND(int, out);
    MATRIX_ROWS(args);
    FOR_CLUSTER_ROWS(r, rows) {
        uint arg = row_argmax(input + (ulong)r * V, V, S);
        if (LID == 0u) out[r] = (int)arg;
    }
}
