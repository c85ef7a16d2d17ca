"""What a rank refuses with the fix: another engine's start call, a shard dealt out again;
and the hooks that patch a module when the job imports it."""
