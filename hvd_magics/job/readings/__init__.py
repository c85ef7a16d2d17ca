"""What the ranks sent, analysed: their steps' splits (with their memory and GPU), who each step
waited for, their output lines sorted, their stacks, their calls of ``checkpoint.preempting()``,
the links measured; the job's picture (:mod:`hvd_magics.job.job_state`) keeps them, and the
verdicts (:mod:`hvd_magics.job.verdicts`) judge them."""
