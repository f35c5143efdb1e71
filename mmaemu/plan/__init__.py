"""Planning of a call: argument validation (:mod:`.validate`), layout definitions (:mod:`.layout`) and the CPU
flush-to-zero refusal (:mod:`.flush`), before any split-K decision, backend choice or computation."""
