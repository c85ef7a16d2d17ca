# The same JVM flags as spark-defaults.conf for the JVMs spark-class starts without an
# application's configuration: the launcher that builds every command, and the standalone
# master and workers of tests/standalone.py.
SPARK_LAUNCHER_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
