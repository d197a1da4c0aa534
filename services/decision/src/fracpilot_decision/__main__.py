from fracpilot_decision.app import main

main()
