"""KafScale: a Kafka-protocol compatible broker with stateless brokers and object-storage logs."""
__version__ = "0.1.0"
