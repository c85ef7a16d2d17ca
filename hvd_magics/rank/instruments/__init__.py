"""What a rank measures and reports without a line of the job's: its steps' split, its GPU,
its DDP steps, its stacks on request, a pool cell's timeline."""
