"""What the cell shows of a running job: its ranks' output as text, the live dashboard, the
charts."""
