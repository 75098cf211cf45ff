"""emulators"""
