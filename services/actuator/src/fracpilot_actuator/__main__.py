from fracpilot_actuator.app import main

main()
