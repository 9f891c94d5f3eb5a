"""The baseline methods the fedkit papers compare against, one plugin module per method."""
