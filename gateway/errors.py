"""placeholder"""
class ConfigurationError(Exception):
    pass
