// argmax (contract 4.2): one cluster per row (cluster-stride), each core the argmax of its slice
// on integer order keys (NaN lowest, -0 == +0), core 0 merges in core order so ties keep the
// lowest id.
__kernel void ENTRY(BUF(const T_STORE, input), BUF(int, out), const uint rows, const uint V) {
    BIND(const T_STORE, input);
    BIND(int, out);
    __local Scratch scratch;
    __local Scratch* S = &scratch;
    for (uint r = GRP; r < rows; r += NGRP) {
        uint arg = row_argmax(input + (ulong)r * V, V, S);
        if (LID == 0u) out[r] = (int)arg;
    }
}
