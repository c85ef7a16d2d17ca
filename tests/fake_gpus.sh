#!/bin/sh
# Two GPUs for Spark's resource discovery (the tests simulate them: none here).
echo '{"name": "gpu", "addresses": ["0", "1"]}'
