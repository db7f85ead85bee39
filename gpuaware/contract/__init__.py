"""The contract between the components: the records of every topic, their schemas, the topic table,
and the Kubernetes annotation and label formats that more than one component reads or writes.

Pure data and encoding: importing it pulls in no Kafka client, no Faust, no Kubernetes client, and
reads no file (schemas are loaded on first use).
"""
